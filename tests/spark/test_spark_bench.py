"""``bucketq bench --spark`` (:mod:`bucketq.bench.spark`) on a tiny workload: counts, not timings.

It lives with the Spark tests (not in tests/bench) for the shared SparkSession fixture: a second
session would cost another JVM start.
"""

from __future__ import annotations

from typing import Any

import pytest

from bucketq.bench.spark import spark_bench
from bucketq.config import Settings

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]


def test_spark_bench_writes_and_reads_every_message(spark: Any, bucket: Settings) -> None:
    result = spark_bench(bucket, messages=2000, payload_bytes=50, partitions=2, spark=spark)
    assert result.read_rows == result.messages == 2000
    assert result.segments > 0 and result.bytes > 0 and result.zlib_bytes > 0
    assert sum(result.write_requests.values()) > 0
    record = result.to_dict()
    assert record["write_requests_per_message"] == pytest.approx(result.write_requests_per_message, abs=1e-5)
    assert record.keys() >= {"write_msgs_per_s", "read_msgs_per_s", "requests_target_met"}
