"""The ``bucketq`` command line: topics, publish, consume, stats, bench, demo.

Exit codes: 0 success, 1 other failure, 2 bad input (usage, config, payload, names, sizes,
unknown topics), 3 the object store is unreachable or refuses access.
"""

from bucketq.cli.app import app, main

__all__ = ["app", "main"]
