"""Real-process chaos tests: producers, consumer-group members and GC as OS processes on one bucket.

A controller (``harness.py``) starts every role as a separate Python process (``worker.py``),
kill -9's and restarts some of them, SIGSTOP/SIGCONT's others for longer than the visibility
timeout, then quiesces (every group drains the topic), stops them and takes a final snapshot of the
bucket. Each process appends what its application observed to its own JSON-lines history file, in
the simulation's history format (``tests/sim/history.py``); ``histories.py`` merges those files
(tolerating the partial last line of a killed process) and checks them with the simulation's pure
checker (``tests/sim/checker.py``) plus two checks only a real bucket's final snapshot allows.

Every process runs with ``BUCKETQ_FENCE_SCALE`` so that GC's fences open within the run (see
``bucketq/core/fences.py``): GC really frees segments and deltas while the chaos goes on.
"""
