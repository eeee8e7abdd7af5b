"""The operator (kopf): reconciles Topic, Consumer and DeadLetterPolicy resources into the bucket,
injects the sidecar with a mutating webhook, collects garbage and exports queue metrics.

Run it with ``bucketq operator``; generate the CRDs with ``bucketq crds``. The engine never
imports this package.
"""

from bucketq._extras import require

# Every module of this package needs the operator extra: fail here, once, with the install hint.
require("bucketq.operator", "operator")
