"""``bucketq bench --spark``: Spark write and read throughput of small messages, S3 requests per message.

``spark_bench(settings)`` writes N generated messages into a fresh topic through the data source
(tasks stage with the engine's producer, the job commit appends), then reads them all back.
Write requests are counted by the engine's storage adapters in every task and in the commit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bucketq import Bucketq
from bucketq.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REQUESTS_PER_MESSAGE_TARGET = 0.01


@dataclass
class SparkBenchResult:
    """Throughput of one write and one full read of ``messages`` messages."""

    messages: int
    payload_bytes: int
    partitions: int
    master: str
    bytes: int = 0  # segment bytes written (and read back)
    segments: int = 0
    write_s: float = 0.0
    read_s: float = 0.0
    read_rows: int = 0
    write_requests: dict[str, int] = field(default_factory=dict)
    write_task_s: float = 0.0  # the slowest write task (staging through the producer)
    write_commit_s: float = 0.0  # the job commit (appending the staged segments)

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
            write_msgs_per_s=round(self.write_msgs_per_s, 1), write_mb_per_s=round(self.write_mb_per_s, 2),
            read_msgs_per_s=round(self.read_msgs_per_s, 1), read_mb_per_s=round(self.read_mb_per_s, 2),
            write_requests_per_message=round(self.write_requests_per_message, 5),
            requests_target_met=self.write_requests_per_message <= REQUESTS_PER_MESSAGE_TARGET,
        )
        return out


async def _create(settings: Settings, topic: str, partitions: int) -> None:
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=partitions)


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
    """Write ``messages`` JSON messages of about ``payload_bytes`` each, then read them back.

    A small warm-up write and read run first (Python workers started), so the numbers are a
    steady-state measurement of the data source, not of Spark's start-up.
    """
    from bucketq.spark.pipelines import read_topic, write_topic
    from bucketq.spark.session import local_session

    spark = spark or local_session("bucketq-bench", master=master)
    topic = topic or f"spark-bench-{uuid.uuid4().hex[:8]}"
    asyncio.run(_create(settings, topic, partitions))
    asyncio.run(_create(settings, topic + "-warmup", partitions))
    result = SparkBenchResult(messages, payload_bytes, partitions, master)
    pad = max(0, payload_bytes - len('{"n":,"pad":""}') - len(str(messages)))
    tasks = max(2, spark.sparkContext.defaultParallelism)

    def generated(n: int) -> DataFrame:
        return spark.range(n, numPartitions=tasks).selectExpr(
            f"to_json(named_struct('n', id, 'pad', repeat('x', {pad}))) AS payload"
        )

    # warm up: Python workers started, code paths compiled (a steady-state measurement)
    write_topic(generated(1000), settings, topic + "-warmup", description="bench warm-up", show=False)
    read_topic(spark, settings, topic + "-warmup").groupBy().count().first()
    df = generated(messages)
    started = time.perf_counter()
    report = write_topic(df, settings, topic, description="bench write", show=False)
    result.write_s = time.perf_counter() - started
    result.bytes, result.segments = int(report.get("bytes", 0)), int(report.get("segments", 0))
    result.write_requests = dict(report.get("requests", {}))
    result.write_task_s = float(report.get("task_seconds", 0.0))
    result.write_commit_s = float(report.get("commit_seconds", 0.0))

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
    """``bucketq bench --spark``: the write and the read as two benchmark records.

    Read requests are not counted (executors do not report them back); about one GET per
    segment plus one LIST per 1000 segments and a HEAD per task.
    """
    data: dict[str, Any] = {"backend": "s3", "s3_endpoint_url": endpoint_url, "s3_bucket": bucket, "strategy": "auto"}
    if access_key is not None:
        data.update(s3_access_key_id=access_key, s3_secret_access_key=secret_key)
    result = spark_bench(
        Settings.from_dict(data), messages=messages, payload_bytes=payload_bytes, partitions=partitions, master=master
    )
    common = {"messages": messages, "payload_bytes": payload_bytes, "partitions": partitions, "master": master}
    return [
        common | {
            "scenario": "spark-write", "seconds": round(result.write_s, 3),
            "msgs_per_s": round(result.write_msgs_per_s, 1), "mb_per_s": round(result.write_mb_per_s, 2),
            "s3_requests_per_message": round(result.write_requests_per_message, 5),
            "s3_requests": result.write_requests, "segments": result.segments, "bytes": result.bytes,
            "task_s": result.write_task_s, "commit_s": result.write_commit_s,
        },
        common | {
            "scenario": "spark-read", "seconds": round(result.read_s, 3), "rows": result.read_rows,
            "msgs_per_s": round(result.read_msgs_per_s, 1), "mb_per_s": round(result.read_mb_per_s, 2),
        },
    ]
