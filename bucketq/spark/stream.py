"""Streaming read: offsets are per-partition segment sequences.

An offset ``{topic: {"0": 12, "1": 7}}`` means "every segment below seq 12 of partition 0 and
below 7 of partition 1 has been read". Segments are immutable and their seqs contiguous, so a
micro-batch ``[start, end)`` always reads the same messages: a query restarted from its
checkpoint continues without gaps or duplicates. A partition added to the topic later starts
at its first segment.

Job commits: an end offset never lies past a segment of an unresolved transaction, nor inside a
committed one (some of its segments below the ends, some above): :func:`~bucketq.core.txn.stream_ends`.
So a micro-batch holds only resolved segments, and a job arrives whole in one micro-batch.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from bucketq.core.topics import find_tail, first_segment
from bucketq.core.txn import TxnSnapshot, stream_ends, take_snapshot, whole_transactions
from bucketq.errors import ConfigError
from bucketq.spark.options import ReadConfig, offsets_json, parse_offsets
from bucketq.spark.planning import SegmentSplit, plan_read, selected_partitions, topic_partitions
from bucketq.spark.reader import read_split
from bucketq.spark.runtime import READ_STRATEGY, keys_of, storage_for


def _optional(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


_LIMITS = "pyspark.sql.streaming.datasource"
_AvailableNow: type = _optional(_LIMITS, "SupportsTriggerAvailableNow") or object
_ReadAllAvailable = _optional(_LIMITS, "ReadAllAvailable")
_ReadMaxFiles = _optional(_LIMITS, "ReadMaxFiles")


class BucketqStreamReader(DataSourceStreamReader, _AvailableNow):
    """Micro-batches of whole segments; ``maxSegmentsPerTrigger`` caps a batch, availableNow works."""

    def __init__(self, cfg: ReadConfig, schema: StructType) -> None:
        self.cfg = cfg
        self.schema = schema
        self._target: dict[int, int] | None = None  # availableNow: never read past this
        self._snapshot = TxnSnapshot()  # the records read with the last tails (I17)

    # -- offsets ---------------------------------------------------------------------------------

    async def _tails(self, first: bool = False) -> dict[int, int]:
        async with storage_for(self.cfg.settings, strategy=READ_STRATEGY) as storage:
            keys = keys_of(self.cfg.settings)
            count = await topic_partitions(storage, keys, self.cfg.topic)
            out = {}
            for p in selected_partitions(count, self.cfg):
                if first:
                    found = await first_segment(storage, keys, self.cfg.topic, p)
                    out[p] = found[0] if found is not None else 0
                else:
                    out[p] = (await find_tail(storage, keys, self.cfg.topic, p))[0]
            if not first:
                # Job commits: the records are read after the tails (a transaction begun later
                # starts above them); see the module docstring.
                self._snapshot = await take_snapshot(storage, keys, self.cfg.topic)
                out = stream_ends(self._snapshot, out)
            return out

    def initialOffset(self) -> dict[str, Any]:
        start = self.cfg.starting_offsets.strip()
        if start == "earliest":
            offsets = asyncio.run(self._tails(first=True))
        elif start == "latest":
            offsets = asyncio.run(self._tails())
        elif start.startswith("{"):
            offsets = parse_offsets(self.cfg.topic, start)
        else:
            raise ConfigError(f"option startingOffsets={start!r}: use earliest, latest or a JSON offset")
        return offsets_json(self.cfg.topic, offsets)

    def getDefaultReadLimit(self) -> Any:
        if self.cfg.max_segments_per_trigger and _ReadMaxFiles is not None:
            return _ReadMaxFiles(self.cfg.max_segments_per_trigger)
        return _ReadAllAvailable() if _ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = asyncio.run(self._tails())

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        tails = self._target if self._target is not None else asyncio.run(self._tails())
        begin = parse_offsets(self.cfg.topic, start) if start else {}
        end = {p: max(seq, begin.get(p, 0)) for p, seq in tails.items()}
        for p, seq in begin.items():
            end.setdefault(p, seq)
        budget = (
            getattr(limit, "max_files", None) if _ReadMaxFiles and isinstance(limit, _ReadMaxFiles) else None
        )
        if budget is not None:
            # a cap may fall inside a job: the batch then takes the whole job (never part of it)
            end = whole_transactions(self._snapshot, _cap(begin, end, budget), end)
        return offsets_json(self.cfg.topic, end)

    # -- reading ---------------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = parse_offsets(self.cfg.topic, start), parse_offsets(self.cfg.topic, end)
        ranges: dict[int, tuple[int, int | None]] = {
            p: (begin.get(p, 0), seq) for p, seq in stop.items() if seq > begin.get(p, 0)
        }
        if not ranges:
            return []

        async def plan() -> list[SegmentSplit]:
            async with storage_for(self.cfg.settings, strategy=READ_STRATEGY) as storage:
                return (await plan_read(storage, keys_of(self.cfg.settings), self.cfg, ranges)).splits

        return asyncio.run(plan())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentSplit)
        yield from read_split(self.cfg, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the source keeps no state of its own (segments are kept by retention)."""


def _cap(begin: dict[int, int], end: dict[int, int], budget: int) -> dict[int, int]:
    """Advance partitions round-robin, one segment at a time, by at most ``budget`` segments."""
    out = {p: begin.get(p, 0) for p in end}
    while budget > 0:
        moved = False
        for p in sorted(end):
            if budget > 0 and out[p] < end[p]:
                out[p] += 1
                budget -= 1
                moved = True
        if not moved:
            break
    return out
