"""``python -m bucketq.sidecar``: the same as ``bucketq sidecar``."""

from bucketq.sidecar.cli import main

if __name__ == "__main__":
    main()
