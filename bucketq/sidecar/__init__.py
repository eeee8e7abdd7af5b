"""The sidecar: runs the engine next to an app and serves it a localhost HTTP API.

Run it with ``bucketq sidecar`` or ``python -m bucketq.sidecar``; configure it with
``BUCKETQ_SIDECAR_*`` (see :mod:`bucketq.sidecar.config`) and the engine's ``BUCKETQ_*``.
The API is documented in ``docs/sidecar-api.md`` and ``openapi/sidecar.yaml``.
"""

from bucketq._extras import require

# Every module of this package needs the sidecar extra: fail here, once, with the install hint.
require("bucketq.sidecar", "sidecar")
