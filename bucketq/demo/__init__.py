"""``bucketq demo``: a queue end to end on an embedded S3, with live progress and what it cost.

Two modes:

* ``sidecar`` (default): a sidecar process and the example worker app (``examples/worker.py``) as a
  separate process, while a producer publishes through the sidecar's localhost HTTP API
  (:mod:`bucketq.demo.sidecar`);
* ``library``: the engine in-process, concurrent producers and consumers (:mod:`bucketq.demo.library`).

Each returns an outcome that says whether a message was lost or delivered twice, or a process
failed; the ``bucketq demo`` command (:mod:`bucketq.cli.demo`) prints it and exits non-zero then.
"""
