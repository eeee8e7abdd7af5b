"""The ``--via sidecar`` benchmark hook runs end to end on a tiny workload."""

from __future__ import annotations

import pytest

from bucketq.bench.sidecar import run_via_sidecar
from tests.support.servers import S3Server

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


async def test_run_via_sidecar_small(moto_server: S3Server) -> None:
    result = await run_via_sidecar(
        moto_server.endpoint_url,
        moto_server.new_bucket(),
        300,
        2,
        2,
        50,
        access_key=moto_server.access_key,
        secret_key=moto_server.secret_key,
        timeout_s=60,
    )
    assert result["completed"], result
    assert (result["scenario"], result["via"], result["messages"], result["acked"]) == (
        "e2e",
        "sidecar",
        300,
        300,
    )
    assert (result["duplicates"], result["lost"], result["in_flight_held"]) == (0, 0, 300)
    assert result["s3_requests"] > 0 and result["msgs_per_s"] > 0
    assert result["p50_ms"] is not None and result["rss_peak_mib"] > 0
