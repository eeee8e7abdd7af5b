"""``bucketq bench --spark``: Spark write and read of small messages against plain Spark on files.

``spark_bench(settings)`` writes N generated JSON messages into a fresh topic through the data
source (uncompressed chunks, then zstd chunks), reads the zstd topic back (all columns, then
``columns=payload``), and, as the baseline in the same run, writes and reads the same rows with
``df.write.json`` / ``spark.read.json`` on local disk. Each phase is measured in wall seconds and
in CPU seconds of the whole process tree (driver, JVM, Python workers, and the S3 server when the
benchmark started it): on a shared machine wall time swings with the load, CPU time much less.
Write requests are counted by the engine's storage adapters in every task and in the commit.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bucketq import Bucketq
from bucketq.bench.cputime import Measured, measured
from bucketq.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# the targets of issue 24 (docs/spark.md), per backend kind: file, S3 server
REQUESTS_PER_MESSAGE_TARGET = 0.0001
TARGETS: dict[str, dict[str, float]] = {
    "file": {"write": 1.5, "read": 1.5, "read_payload": 1.0},
    "s3": {"write": 2.0, "read": 2.0, "read_payload": 1.2},
}
BYTES_TARGET = {"plain": 140.0, "zstd": 35.0}


@dataclass
class SparkBenchResult:
    """Every phase of one run (wall and CPU seconds), sizes and requests."""

    messages: int
    payload_bytes: int
    partitions: int
    master: str
    phases: dict[str, Measured] = field(default_factory=dict)
    bytes: int = 0  # chunk bytes written, uncompressed chunks
    zstd_bytes: int = 0  # chunk bytes of the same messages with compression=zstd
    line_bytes: int = 0  # the chunks' columns before compression
    json_bytes: int = 0  # df.write.json of the same rows
    segments: int = 0
    chunks: int = 0
    read_rows: int = 0
    payload_rows: int = 0
    write_requests: dict[str, int] = field(default_factory=dict)
    write_task_s: float = 0.0  # the slowest write task
    write_commit_s: float = 0.0  # the job commit (reference segments)

    def seconds(self, phase: str) -> float:
        return self.phases[phase].wall_s if phase in self.phases else 0.0

    @property
    def write_requests_per_message(self) -> float:
        return sum(self.write_requests.values()) / self.messages if self.messages else 0.0

    def ratio(self, phase: str, baseline: str, what: str = "wall_s") -> float:
        a, b = self.phases.get(phase), self.phases.get(baseline)
        if a is None or b is None:
            return 0.0
        num, den = (a.wall_s, b.wall_s) if what == "wall_s" else (a.cpu_s, b.cpu_s)
        return round(num / den, 2) if den else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["phases"] = {
            k: {"wall_s": round(v.wall_s, 3), "cpu_s": round(v.cpu_s, 3)} for k, v in self.phases.items()
        }
        out.update(
            write_requests_per_message=round(self.write_requests_per_message, 6),
            requests_target_met=self.write_requests_per_message <= REQUESTS_PER_MESSAGE_TARGET,
        )
        return out


async def _create(settings: Settings, topic: str, partitions: int) -> None:
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=partitions)


def _dir_bytes(path: str) -> int:
    return sum(
        f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.name.startswith((".", "_"))
    )


def spark_bench(
    settings: Settings,
    *,
    messages: int = 1_000_000,
    payload_bytes: int = 100,
    partitions: int = 4,
    master: str = "local[2]",
    spark: SparkSession | None = None,
    topic: str | None = None,
) -> SparkBenchResult:
    """Every phase of the benchmark once (see the module docstring).

    A small warm-up write and read run first (Python workers started), so the numbers are a
    steady-state measurement of the data source, not of Spark's start-up.
    """
    from bucketq.spark.pipelines import read_topic, write_topic
    from bucketq.spark.session import local_session

    spark = spark or local_session("bucketq-bench", master=master)
    topic = topic or f"spark-bench-{uuid.uuid4().hex[:8]}"
    for name in (topic, topic + "-zstd", topic + "-warmup"):
        asyncio.run(_create(settings, name, partitions))
    result = SparkBenchResult(messages, payload_bytes, partitions, master)
    pad = max(0, payload_bytes - len('{"n":,"pad":""}') - len(str(messages)))
    tasks = max(2, spark.sparkContext.defaultParallelism)

    def generated(n: int) -> DataFrame:
        return spark.range(n, numPartitions=tasks).selectExpr(
            f"to_json(named_struct('n', id, 'pad', repeat('x', {pad}))) AS payload"
        )

    def count(df: DataFrame) -> int:
        row = df.groupBy().count().first()
        return int(row[0]) if row is not None else 0

    phases = result.phases
    with tempfile.TemporaryDirectory(prefix="bucketq-bench-") as tmp:
        # warm up: Python workers started, code paths compiled (a steady-state measurement)
        write_topic(generated(1000), settings, topic + "-warmup", description="bench warm-up", show=False)
        count(read_topic(spark, settings, topic + "-warmup"))
        generated(1000).write.json(f"{tmp}/warmup")
        count(spark.read.schema("payload STRING").json(f"{tmp}/warmup"))

        with measured() as phases["json_write"]:
            generated(messages).write.json(f"{tmp}/json")
        result.json_bytes = _dir_bytes(f"{tmp}/json")
        with measured() as phases["json_read"]:
            count(spark.read.schema("payload STRING").json(f"{tmp}/json"))

        with measured() as phases["write"]:
            report = write_topic(
                generated(messages),
                settings,
                topic,
                description="bench write",
                show=False,
                compression="none",
            )
        result.bytes, result.segments = int(report.get("bytes", 0)), int(report.get("segments", 0))
        result.chunks = int(report.get("chunks", 0))
        result.line_bytes = int(report.get("payload_bytes", 0))
        result.write_requests = dict(report.get("requests", {}))
        result.write_task_s = float(report.get("task_seconds", 0.0))
        result.write_commit_s = float(report.get("commit_seconds", 0.0))

        with measured() as phases["write_zstd"]:
            zipped = write_topic(
                generated(messages), settings, topic + "-zstd", description="bench write (zstd)", show=False
            )
        result.zstd_bytes = int(zipped.get("bytes", 0))

    with measured() as phases["read"]:
        result.read_rows = count(read_topic(spark, settings, topic + "-zstd"))
    with measured() as phases["read_payload"]:
        result.payload_rows = count(read_topic(spark, settings, topic + "-zstd", columns="payload"))
    return result


def spark_records(r: SparkBenchResult, backend: str) -> list[dict[str, Any]]:
    """The run as ``bucketq bench`` records: one per phase, with both ratios to plain Spark.

    ``vs_json`` is the bucketq wall time over the ``df.write.json`` / ``spark.read.json`` wall time
    of the same rows on local disk (same run), ``vs_json_cpu`` the same for CPU seconds of the
    process tree. Read requests are not counted (executors do not report them back): one GET per
    chunk plus the planner's LISTs and transaction records.
    """
    n = max(1, r.messages)
    kind = "file" if backend == "file" else "s3"
    common = {
        "backend": backend,
        "messages": r.messages,
        "payload_bytes": r.payload_bytes,
        "partitions": r.partitions,
        "master": r.master,
    }

    def phase(name: str, baseline: str | None, **extra: Any) -> dict[str, Any]:
        m = r.phases[name]
        out = common | {
            "scenario": f"spark-{name.replace('_', '-')}"
            if not name.startswith("json")
            else name.replace("_", "-") + "-local",
            "seconds": round(m.wall_s, 3),
            "cpu_s": round(m.cpu_s, 3),
            "msgs_per_s": round(r.messages / m.wall_s, 1) if m.wall_s else 0.0,
        }
        if baseline is not None:
            out["vs_json"] = r.ratio(name, baseline)
            out["vs_json_cpu"] = r.ratio(name, baseline, "cpu_s")
            target = TARGETS[kind].get(name)
            if target is not None:
                out["target"] = target
        return out | extra

    return [
        phase(
            "write",
            "json_write",
            s3_requests=r.write_requests,
            s3_requests_per_message=round(r.write_requests_per_message, 6),
            requests_target=REQUESTS_PER_MESSAGE_TARGET,
            segments=r.segments,
            chunks=r.chunks,
            bytes=r.bytes,
            bytes_per_message=round(r.bytes / n, 1),
            bytes_target=BYTES_TARGET["plain"],
            task_s=r.write_task_s,
            commit_s=r.write_commit_s,
        ),
        phase(
            "write_zstd",
            "json_write",
            bytes=r.zstd_bytes,
            bytes_per_message=round(r.zstd_bytes / n, 1),
            bytes_target=BYTES_TARGET["zstd"],
        ),
        phase("read", "json_read", rows=r.read_rows),
        phase("read_payload", "json_read", rows=r.payload_rows),
        phase("json_write", None, bytes=r.json_bytes, bytes_per_message=round(r.json_bytes / n, 1)),
        phase("json_read", None),
    ]


def run_spark_bench(
    settings: Settings,
    backend: str,
    messages: int = 1_000_000,
    partitions: int = 4,
    payload_bytes: int = 100,
    *,
    master: str = "local[2]",
) -> list[dict[str, Any]]:
    """``bucketq bench --spark``: every phase of one run as records (:func:`spark_records`)."""
    r = spark_bench(
        settings, messages=messages, payload_bytes=payload_bytes, partitions=partitions, master=master
    )
    return spark_records(r, backend)
