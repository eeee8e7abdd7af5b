"""``python -m bucketq.cli``."""

from bucketq.cli.app import main

main()
