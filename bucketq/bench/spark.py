"""``bucketq bench --spark``: Spark write and read throughput of small messages, S3 requests per message.

``spark_bench(settings)`` writes N generated messages into a fresh topic through the data source
(tasks encode and stage chunks, the job commit appends them as one transaction), again with zlib
segments, then reads them all back; and, as the baseline, writes and reads the same rows with
``df.write.json`` / ``spark.read.json`` on local disk. Write requests are counted by the engine's
storage adapters in every task and in the commit.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bucketq import Bucketq
from bucketq.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REQUESTS_PER_MESSAGE_TARGET = 0.01


@dataclass
class SparkBenchResult:
    """Throughput of writes and one full read of ``messages`` messages, and the plain-JSON baseline."""

    messages: int
    payload_bytes: int
    partitions: int
    master: str
    bytes: int = 0  # segment bytes written (and read back), uncompressed write
    line_bytes: int = 0  # message lines (envelope + payload) before compression
    zlib_bytes: int = 0  # segment bytes of the same messages written with compression=zlib
    segments: int = 0
    write_s: float = 0.0
    write_zlib_s: float = 0.0
    read_s: float = 0.0
    read_rows: int = 0
    json_write_s: float = 0.0  # df.write.json of the same rows to local disk
    json_read_s: float = 0.0  # spark.read.json of those files, counted
    json_bytes: int = 0
    write_requests: dict[str, int] = field(default_factory=dict)
    write_task_s: float = 0.0  # the slowest write task (encoding and staging)
    write_commit_s: float = 0.0  # the job commit (appending the staged chunks)

    @property
    def write_msgs_per_s(self) -> float:
        return self.messages / self.write_s if self.write_s else 0.0

    @property
    def write_mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.write_s if self.write_s else 0.0

    @property
    def read_msgs_per_s(self) -> float:
        return self.read_rows / self.read_s if self.read_s else 0.0

    @property
    def read_mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.read_s if self.read_s else 0.0

    @property
    def write_requests_per_message(self) -> float:
        return sum(self.write_requests.values()) / self.messages if self.messages else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            write_msgs_per_s=round(self.write_msgs_per_s, 1),
            write_mb_per_s=round(self.write_mb_per_s, 2),
            read_msgs_per_s=round(self.read_msgs_per_s, 1),
            read_mb_per_s=round(self.read_mb_per_s, 2),
            write_requests_per_message=round(self.write_requests_per_message, 5),
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
    """Write ``messages`` JSON messages of about ``payload_bytes`` each (plain, then zlib segments),
    read them back, and do the same rows with ``df.write.json`` / ``spark.read.json`` on local disk.

    A small warm-up write and read run first (Python workers started), so the numbers are a
    steady-state measurement of the data source, not of Spark's start-up.
    """
    from bucketq.spark.pipelines import read_topic, write_topic
    from bucketq.spark.session import local_session

    spark = spark or local_session("bucketq-bench", master=master)
    topic = topic or f"spark-bench-{uuid.uuid4().hex[:8]}"
    for name in (topic, topic + "-zlib", topic + "-warmup"):
        asyncio.run(_create(settings, name, partitions))
    result = SparkBenchResult(messages, payload_bytes, partitions, master)
    pad = max(0, payload_bytes - len('{"n":,"pad":""}') - len(str(messages)))
    tasks = max(2, spark.sparkContext.defaultParallelism)

    def generated(n: int) -> DataFrame:
        return spark.range(n, numPartitions=tasks).selectExpr(
            f"to_json(named_struct('n', id, 'pad', repeat('x', {pad}))) AS payload"
        )

    with tempfile.TemporaryDirectory(prefix="bucketq-bench-") as tmp:
        # warm up: Python workers started, code paths compiled (a steady-state measurement)
        write_topic(generated(1000), settings, topic + "-warmup", description="bench warm-up", show=False)
        read_topic(spark, settings, topic + "-warmup").groupBy().count().first()
        generated(1000).write.json(f"{tmp}/warmup")

        started = time.perf_counter()
        generated(messages).write.json(f"{tmp}/json")
        result.json_write_s = time.perf_counter() - started
        result.json_bytes = _dir_bytes(f"{tmp}/json")
        started = time.perf_counter()
        spark.read.schema("payload STRING").json(f"{tmp}/json").groupBy().count().first()
        result.json_read_s = time.perf_counter() - started

        started = time.perf_counter()
        report = write_topic(generated(messages), settings, topic, description="bench write", show=False)
        result.write_s = time.perf_counter() - started
        result.bytes, result.segments = int(report.get("bytes", 0)), int(report.get("segments", 0))
        result.line_bytes = int(report.get("payload_bytes", 0))
        result.write_requests = dict(report.get("requests", {}))
        result.write_task_s = float(report.get("task_seconds", 0.0))
        result.write_commit_s = float(report.get("commit_seconds", 0.0))

        started = time.perf_counter()
        zipped = write_topic(
            generated(messages),
            settings,
            topic + "-zlib",
            description="bench write (zlib)",
            show=False,
            compression="zlib",
        )
        result.write_zlib_s = time.perf_counter() - started
        result.zlib_bytes = int(zipped.get("bytes", 0))

    started = time.perf_counter()
    counted = read_topic(spark, settings, topic).groupBy().count().first()
    result.read_s = time.perf_counter() - started
    result.read_rows = int(counted[0]) if counted is not None else 0
    return result


def run_spark_bench(
    endpoint_url: str,
    bucket: str,
    messages: int = 1_000_000,
    partitions: int = 4,
    payload_bytes: int = 100,
    *,
    access_key: str | None = None,
    secret_key: str | None = None,
    master: str = "local[2]",
) -> list[dict[str, Any]]:
    """``bucketq bench --spark``: the writes, the read and the plain-JSON baseline as records.

    ``vs_json`` is the bucketq time over the ``df.write.json`` / ``spark.read.json`` time of the
    same rows on local disk. Read requests are not counted (executors do not report them back):
    about one GET per segment plus one LIST per 1000 segments and a HEAD per task.
    """
    data: dict[str, Any] = {
        "backend": "s3",
        "s3_endpoint_url": endpoint_url,
        "s3_bucket": bucket,
        "strategy": "auto",
    }
    if access_key is not None:
        data.update(s3_access_key_id=access_key, s3_secret_access_key=secret_key)
    r = spark_bench(
        Settings.from_dict(data),
        messages=messages,
        payload_bytes=payload_bytes,
        partitions=partitions,
        master=master,
    )
    n = max(1, messages)
    common = {
        "messages": messages,
        "payload_bytes": payload_bytes,
        "partitions": partitions,
        "master": master,
    }

    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b else 0.0

    return [
        common
        | {
            "scenario": "spark-write",
            "seconds": round(r.write_s, 3),
            "msgs_per_s": round(r.write_msgs_per_s, 1),
            "mb_per_s": round(r.write_mb_per_s, 2),
            "vs_json": ratio(r.write_s, r.json_write_s),
            "s3_requests_per_message": round(r.write_requests_per_message, 5),
            "s3_requests": r.write_requests,
            "segments": r.segments,
            "bytes": r.bytes,
            "bytes_per_message": round(r.bytes / n, 1),
            "line_bytes_per_message": round(r.line_bytes / n, 1),
            "task_s": r.write_task_s,
            "commit_s": r.write_commit_s,
        },
        common
        | {
            "scenario": "spark-write-zlib",
            "seconds": round(r.write_zlib_s, 3),
            "msgs_per_s": round(messages / r.write_zlib_s, 1) if r.write_zlib_s else 0.0,
            "vs_json": ratio(r.write_zlib_s, r.json_write_s),
            "bytes": r.zlib_bytes,
            "bytes_per_message": round(r.zlib_bytes / n, 1),
        },
        common
        | {
            "scenario": "spark-read",
            "seconds": round(r.read_s, 3),
            "rows": r.read_rows,
            "msgs_per_s": round(r.read_msgs_per_s, 1),
            "mb_per_s": round(r.read_mb_per_s, 2),
            "vs_json": ratio(r.read_s, r.json_read_s),
        },
        common
        | {
            "scenario": "json-write-local",
            "seconds": round(r.json_write_s, 3),
            "msgs_per_s": round(messages / r.json_write_s, 1) if r.json_write_s else 0.0,
            "bytes": r.json_bytes,
            "bytes_per_message": round(r.json_bytes / n, 1),
        },
        common
        | {
            "scenario": "json-read-local",
            "seconds": round(r.json_read_s, 3),
            "msgs_per_s": round(messages / r.json_read_s, 1) if r.json_read_s else 0.0,
        },
    ]
