"""``bucketq bench``: throughput, request cost and latency of the engine on a local backend.

Scenarios: ``publish`` (producers only), ``consume`` (a preloaded backlog, consumers only), ``e2e``
(producers and consumers at once, unthrottled) and ``latency`` (paced publishing, publish to
receive) in :mod:`~bucketq.bench.scenarios`; the bills: ``idle`` (what idle members cost per month,
pickup after a silence; :mod:`~bucketq.bench.idle`), ``cost`` (price per message at each publish
rate, open loop) and ``awaited`` (one producer shared by tasks awaiting their publishes;
:mod:`~bucketq.bench.cost`). Backends: a moto server or SeaweedFS process started for the run, a
temp directory (``file``) or ``memory``. See :func:`bucketq.bench.runner.run_scenarios` and
:func:`bucketq.bench.backends.open_backend`.

Requests are counted by the client (:mod:`~bucketq.bench.metered`) and, on moto, by the server from
its access log (:mod:`~bucketq.bench.accesslog`) over the same windows
(:mod:`~bucketq.bench.metering`), and priced at list prices (:mod:`~bucketq.bench.pricing`).

Every benchmark lives here, outside the runtime packages, and shares one delivery tracker
(:mod:`~bucketq.bench.tracker`) and one process launcher (:mod:`~bucketq.bench.servers`):
:mod:`~bucketq.bench.sidecar` (``--via sidecar``: apps speaking HTTP to sidecar processes) and
:mod:`~bucketq.bench.spark` (``--spark``: the data source's write and read throughput). The runtime
packages never import this one.
"""
