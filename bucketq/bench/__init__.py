"""``bucketq bench``: throughput, request cost and latency of the engine on a local backend.

Scenarios: ``publish`` (producers only), ``consume`` (a preloaded backlog, consumers only), ``e2e``
(producers and consumers at once, unthrottled) and ``latency`` (paced publishing, publish to
receive). Backends: a moto server or SeaweedFS process started for the run, a temp directory
(``file``) or ``memory``. See :func:`bucketq.bench.runner.run_bench`.
"""
