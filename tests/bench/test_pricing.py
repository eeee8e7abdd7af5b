"""List prices of the bench's bills (bucketq/bench/pricing.py), against the published figures."""

from __future__ import annotations

import math

import pytest

from bucketq.bench.pricing import (
    MINUTES_PER_MONTH,
    SQS_IDLE_USD_PER_MONTH,
    SQS_USD_PER_MILLION_MESSAGES,
    usd,
    usd_per_request,
)


@pytest.mark.parametrize(
    ("op", "per_1000"),
    [
        ("PUT", 0.005),
        ("COPY", 0.005),
        ("POST", 0.005),
        ("LIST", 0.005),
        ("GET", 0.0004),
        ("HEAD", 0.0004),
        ("OTHER", 0.0004),
        ("DELETE", 0.0),
    ],
)
def test_s3_standard_list_prices(op: str, per_1000: float) -> None:
    assert usd_per_request(op) * 1000 == pytest.approx(per_1000, rel=1e-12)


def test_a_bill_is_counts_times_prices() -> None:
    assert usd({"PUT": 2000, "GET": 10_000, "LIST": 1000, "DELETE": 500}) == pytest.approx(
        2 * 0.005 + 10 * 0.0004 + 0.005, rel=1e-12
    )
    assert usd({}) == 0


def test_sqs_figures() -> None:
    assert MINUTES_PER_MONTH == 43_200
    assert math.isclose(SQS_USD_PER_MILLION_MESSAGES, 1.20, rel_tol=1e-12)  # send + receive + delete
    assert math.isclose(SQS_IDLE_USD_PER_MONTH, 3 * 43_200 * 0.40 / 1e6, rel_tol=1e-12)  # ~$0.05
