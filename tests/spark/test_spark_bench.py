"""``bucketq bench --spark`` (:mod:`bucketq.bench.spark`) on a tiny workload: counts, not timings.

It lives with the Spark tests (not in tests/bench) for the shared SparkSession fixture: a second
session would cost another JVM start. It runs on the file backend, which the benchmark supports
as well as S3 servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bucketq.bench.cputime import tree_cpu_seconds
from bucketq.bench.spark import spark_bench, spark_records
from bucketq.config import Settings

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_spark_bench_writes_and_reads_every_message(spark: Any, tmp_path: Path) -> None:
    settings = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path), "strategy": "conditional_write"}
    )
    result = spark_bench(settings, messages=2000, payload_bytes=50, partitions=2, spark=spark)
    assert result.read_rows == result.payload_rows == result.messages == 2000
    assert result.segments > 0 and result.chunks > 0 and 0 < result.zstd_bytes < result.bytes
    assert sum(result.write_requests.values()) > 0
    phases = {"json_write", "json_read", "write", "write_zstd", "read", "read_payload"}
    assert set(result.phases) == phases
    # the whole process tree's CPU (the JVM and its Python workers are children of this process)
    assert all(m.wall_s > 0 and m.cpu_s > 0 for m in result.phases.values())
    records = {r["scenario"]: r for r in spark_records(result, "file")}
    assert set(records) == {
        "spark-write",
        "spark-write-zstd",
        "spark-read",
        "spark-read-payload",
        "json-write-local",
        "json-read-local",
    }
    for name in ("spark-write", "spark-read", "spark-read-payload"):
        assert records[name]["vs_json"] > 0 and records[name]["vs_json_cpu"] > 0 and records[name]["target"]
    assert records["spark-write"]["s3_requests_per_message"] == round(result.write_requests_per_message, 6)


def test_process_tree_cpu_counts_children() -> None:
    import subprocess
    import sys

    before = tree_cpu_seconds()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert tree_cpu_seconds() - before >= 0.05  # the reaped child's CPU time is the tree's
