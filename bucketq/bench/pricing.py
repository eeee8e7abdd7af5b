"""List prices the bench bills requests at (AWS S3 Standard, us-east-1) and SQS's figures beside them.

Operation names are those of :class:`bucketq.storage.RequestStats` and
:mod:`bucketq.bench.accesslog`: ``PUT``, ``POST`` and ``LIST`` (and COPY, which is a PUT on the wire)
are in the $0.005 per 1,000 tier; ``GET``, ``HEAD`` and anything else in the $0.0004 per 1,000 tier;
``DELETE`` (multi-object deletes included) is free.
"""

from __future__ import annotations

from collections.abc import Mapping

S3_USD_PER_1000: dict[str, float] = {
    "PUT": 0.005,
    "COPY": 0.005,
    "POST": 0.005,
    "LIST": 0.005,
    "GET": 0.0004,
    "HEAD": 0.0004,
    "DELETE": 0.0,
}
S3_OTHER_USD_PER_1000 = 0.0004  # "GET and all other requests"

MINUTES_PER_MONTH = 30 * 24 * 60  # a 30-day month

# SQS Standard: $0.40 per million requests; a message is sent, received and deleted (3 requests,
# unbatched); an idle consumer long-polling with a 20 s wait makes 3 requests a minute.
SQS_USD_PER_REQUEST = 0.40 / 1_000_000
SQS_REQUESTS_PER_MESSAGE = 3
SQS_USD_PER_MILLION_MESSAGES = SQS_REQUESTS_PER_MESSAGE * SQS_USD_PER_REQUEST * 1_000_000  # $1.20
SQS_IDLE_REQUESTS_PER_MIN = 3.0
SQS_IDLE_USD_PER_MONTH = SQS_IDLE_REQUESTS_PER_MIN * MINUTES_PER_MONTH * SQS_USD_PER_REQUEST  # ~$0.05


def usd_per_request(op: str) -> float:
    """The list price of one request of operation ``op``."""
    return S3_USD_PER_1000.get(op, S3_OTHER_USD_PER_1000) / 1000


def usd(by_op: Mapping[str, float]) -> float:
    """The list price of ``by_op`` requests (counts, or rates: the result is in the same unit)."""
    return sum(count * usd_per_request(op) for op, count in by_op.items())
