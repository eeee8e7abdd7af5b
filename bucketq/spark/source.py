"""The ``bucketq`` PySpark data source: batch read, batch write and streaming read of a topic."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from bucketq.core.ids import stable_id
from bucketq.core.registry import Registry
from bucketq.core.topics import TopicCatalog
from bucketq.errors import ConfigError
from bucketq.spark import stream
from bucketq.spark.commit import abort_job, commit_job, prepare_job
from bucketq.spark.options import ReadConfig, WriteConfig, read_columns
from bucketq.spark.planning import SegmentSplit, plan_read
from bucketq.spark.reader import read_split
from bucketq.spark.rows import RowMapper
from bucketq.spark.runtime import READ_STRATEGY, keys_of, settings_of, storage_for
from bucketq.spark.schema import message_schema
from bucketq.spark.writing import TaskCommit, skip_task, write_task
from bucketq.storage.strategies import probe_strategy

PRODUCER_NAME = "spark"


class BucketqDataSource(DataSource):
    """``spark.read.format("bucketq")``, ``df.write.format("bucketq")``, ``spark.readStream...``.

    The source and its readers keep no state between queries: every scan is planned from the
    options alone. Reads are narrowed with the ``partitions``/``startSeq``/``endSeq``/``since``/
    ``until`` options; SQL filters are evaluated by Spark (the source implements no filter
    pushdown: Spark >= 4.1 keeps the scan a pushdown planned on the DataFrame and reuses it for
    later queries that have nothing to push, which would then see the earlier query's rows only).
    """

    @classmethod
    def name(cls) -> str:
        return "bucketq"

    def schema(self) -> StructType:
        opts = {str(k).lower(): v for k, v in self.options.items()}
        with_state = bool(opts.get("consumer"))
        return message_schema(with_state=with_state, columns=read_columns(opts, with_state=with_state))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BucketqReader(ReadConfig.from_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> BucketqWriter:
        if overwrite:
            raise ConfigError("a topic is append-only: use mode('append')")
        cfg = WriteConfig.from_options(self.options)
        RowMapper(schema, cfg)  # reject unusable columns before any task starts
        asyncio.run(_prepare_write(cfg))
        return BucketqWriter(cfg, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        cfg = ReadConfig.from_options(self.options, stream=True)
        return stream.BucketqStreamReader(cfg, schema)


async def _prepare_write(cfg: WriteConfig) -> None:
    """On the driver: check the topic, copy its limits, settle the put-if-absent strategy once, and
    settle what earlier runs of the same job left (the job may already be committed)."""
    settings = settings_of(cfg.settings)
    async with storage_for(cfg.settings, strategy=READ_STRATEGY) as storage:
        keys = keys_of(cfg.settings)
        marker = await TopicCatalog(storage, keys).marker(cfg.topic, fresh=True)
        cfg.partitions, cfg.max_message_bytes = marker.config.partitions, marker.config.max_message_bytes
        cfg.incarnation = getattr(marker, "incarnation", "") or ""
        if settings.strategy == "auto":
            cfg.settings["strategy"] = await probe_strategy(storage.store, settings.root)
        await Registry(storage, keys).register("producer", PRODUCER_NAME, component="spark")
    cfg.producer_id = stable_id("producer", PRODUCER_NAME)
    cfg.run = uuid.uuid4().hex[:16]
    async with storage_for(cfg.settings) as storage:
        cfg.done = await prepare_job(storage, keys_of(cfg.settings), cfg)


class BucketqReader(DataSourceReader):
    """Plans splits on the driver (segments grouped by size) and reads them on executors.

    Stateless: ``cfg`` is immutable and fixed when the reader is made, once per scan.
    """

    def __init__(self, cfg: ReadConfig, schema: StructType) -> None:
        self.cfg = cfg
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        async def plan() -> list[SegmentSplit]:
            async with storage_for(self.cfg.settings, strategy=READ_STRATEGY) as storage:
                return (await plan_read(storage, keys_of(self.cfg.settings), self.cfg)).splits

        splits = asyncio.run(plan())
        return splits or [SegmentSplit(0, [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentSplit)
        if partition.items:
            yield from read_split(self.cfg, self.schema, partition)


class BucketqWriter(DataSourceArrowWriter):
    """Tasks write chunks; the job commit references them in one transaction; abort removes them."""

    def __init__(self, cfg: WriteConfig, schema: StructType) -> None:
        self.cfg = cfg
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)
        if self.cfg.done is not None:  # the job was committed before: write nothing again
            return skip_task(task, iterator)
        return write_task(self.cfg, self.schema, task, attempt, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        asyncio.run(commit_job(self.cfg, [m if isinstance(m, TaskCommit) else None for m in messages]))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        asyncio.run(abort_job(self.cfg))
