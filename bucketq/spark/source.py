"""The ``bucketq`` PySpark data source: batch read, batch write and streaming read of a topic."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

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
from bucketq.spark import filters, stream
from bucketq.spark.commit import abort_job, commit_job
from bucketq.spark.options import ReadConfig, WriteConfig
from bucketq.spark.planning import SegmentSplit, plan_read
from bucketq.spark.reader import read_split
from bucketq.spark.rows import RowMapper
from bucketq.spark.runtime import READ_STRATEGY, keys_of, settings_of, storage_for
from bucketq.spark.schema import message_schema
from bucketq.spark.staging import TaskCommit, stage_task
from bucketq.storage import probe_strategy

PRODUCER_NAME = "spark"


class BucketqDataSource(DataSource):
    """``spark.read.format("bucketq")``, ``df.write.format("bucketq")``, ``spark.readStream...``.

    SQL filters on partition, seq and created_at are pushed down when the session enables
    ``spark.sql.python.filterPushdown.enabled`` (:func:`bucketq.spark.register` does) or with
    ``option("pushdown", "true")``; the ``partitions``/``startSeq``/``endSeq``/``since``/``until``
    options always work.
    """

    pushdown_default = False

    @classmethod
    def name(cls) -> str:
        return "bucketq"

    def schema(self) -> StructType:
        opts = {str(k).lower(): v for k, v in self.options.items()}
        return message_schema(with_state=bool(opts.get("consumer")))

    def _pushdown(self) -> bool:
        opts = {str(k).lower(): str(v).lower() for k, v in self.options.items()}
        if "pushdown" in opts:
            return opts["pushdown"] == "true"
        return self.pushdown_default

    def reader(self, schema: StructType) -> DataSourceReader:
        cfg = ReadConfig.from_options(self.options)
        if self._pushdown():
            return PushdownReader(cfg, schema)
        return BucketqReader(cfg, schema)

    def writer(self, schema: StructType, overwrite: bool) -> BucketqWriter:
        if overwrite:
            raise ConfigError("a topic is append-only: use mode('append')")
        cfg = WriteConfig.from_options(self.options)
        RowMapper(schema, cfg)  # reject unusable columns before any task starts
        asyncio.run(_prepare_write(cfg))
        return BucketqWriter(cfg, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        cfg = ReadConfig.from_options(self.options)
        if cfg.consumer:
            raise ConfigError("option consumer is for batch reads; a stream reads every message once")
        return stream.BucketqStreamReader(cfg, schema)


class PushdownDataSource(BucketqDataSource):
    """The same source with SQL filter pushdown on (registered when the session allows it)."""

    pushdown_default = True


async def _prepare_write(cfg: WriteConfig) -> None:
    """On the driver: check the topic, copy its limits, settle the put-if-absent strategy once."""
    settings = settings_of(cfg.settings)
    async with storage_for(cfg.settings, strategy=READ_STRATEGY) as storage:
        keys = keys_of(cfg.settings)
        config = await TopicCatalog(storage, keys).config(cfg.topic)
        cfg.partitions, cfg.max_message_bytes = config.partitions, config.max_message_bytes
        if settings.strategy == "auto":
            cfg.settings["strategy"] = await probe_strategy(storage.store, settings.root)
        await Registry(storage, keys).register("producer", PRODUCER_NAME, component="spark")
    cfg.producer_id = stable_id("producer", PRODUCER_NAME)


class BucketqReader(DataSourceReader):
    """Plans splits on the driver (segments grouped by size) and reads them on executors."""

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
        if partition.segments:
            yield from read_split(self.cfg, self.schema, partition)


class PushdownReader(BucketqReader):
    """A reader that also takes partition, seq and created_at predicates from Spark."""

    def pushFilters(self, filters_: list[Any]) -> list[Any]:
        return filters.push(self.cfg, filters_)


class BucketqWriter(DataSourceArrowWriter):
    """Tasks stage through the engine's producer; the job commit appends; abort removes."""

    def __init__(self, cfg: WriteConfig, schema: StructType) -> None:
        self.cfg = cfg
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)
        mapper = RowMapper(self.schema, self.cfg)
        return asyncio.run(stage_task(self.cfg, task, attempt, iterator, mapper))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        asyncio.run(commit_job(self.cfg, [m if isinstance(m, TaskCommit) else None for m in messages]))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        asyncio.run(abort_job(self.cfg))

