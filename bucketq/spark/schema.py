"""The DataFrame schema of a topic, and segments turned into Arrow batches of exactly that schema."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bucketq.core.segment import Segment

STATE_COLUMN = "state"
STATES = ("pending", "in_flight", "acked", "dead")
# columns that describe where a message is, not what it is (ignored by the writer)
POSITION_COLUMNS = ("topic", "partition", "seq", "index", "offset", STATE_COLUMN)

_FIELDS = [
    StructField("id", StringType(), False),
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("seq", LongType(), False),
    StructField("index", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("key", StringType(), True),
    StructField("headers", MapType(StringType(), StringType(), False), False),
    StructField("payload", StringType(), True),
    StructField("data", BinaryType(), True),
    StructField("content_type", StringType(), False),
    StructField("created_at", TimestampType(), False),
    StructField("producer_id", StringType(), True),
    StructField("priority", IntegerType(), False),
    StructField("not_before", TimestampType(), True),
    StructField("dedup_id", StringType(), True),
]


def message_schema(with_state: bool = False) -> StructType:
    """One row per message; with ``state`` (pending, in_flight, acked, dead) for a consumer."""
    fields = list(_FIELDS)
    if with_state:
        fields.append(StructField(STATE_COLUMN, StringType(), False))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema`` (timestamps in UTC microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # older pyspark without the timezone argument
        return to_arrow_schema(schema)


def _micros(ts: float) -> int:
    return round(ts * 1_000_000)


def _payload_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class BatchBuilder:
    """Accumulates messages of decoded segments and emits Arrow record batches."""

    def __init__(self, schema: StructType, topic: str) -> None:
        self.schema = schema
        self.arrow = arrow_schema(schema)
        self.topic = topic
        self.with_state = STATE_COLUMN in schema.fieldNames()
        self._reset()

    def _reset(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in self.schema.fieldNames()}
        self.rows = 0

    def add(self, segment: Segment, keep: list[int] | None = None, states: list[str] | None = None) -> None:
        """Append the segment's messages (only indexes in ``keep`` when given)."""
        h = segment.header
        c = self.cols
        indexes = range(len(segment.records)) if keep is None else keep
        for n, i in enumerate(indexes):
            r = segment.records[i]
            c["id"].append(r.id)
            c["topic"].append(self.topic)
            c["partition"].append(h.partition)
            c["seq"].append(h.seq)
            c["index"].append(i)
            c["offset"].append(h.base + i)
            c["key"].append(r.key)
            c["headers"].append(list(r.headers.items()))
            c["payload"].append(_payload_text(r.payload) if r.data is None else None)
            c["data"].append(r.data)
            c["content_type"].append(r.content_type)
            c["created_at"].append(_micros(r.created_at))
            c["producer_id"].append(r.producer_id)
            c["priority"].append(r.priority)
            c["not_before"].append(_micros(r.not_before) if r.not_before is not None else None)
            c["dedup_id"].append(r.dedup_id)
            if self.with_state:
                c[STATE_COLUMN].append(states[n] if states is not None else "pending")
        self.rows += len(indexes)

    def flush(self) -> pa.RecordBatch | None:
        """The accumulated rows as one batch (None when empty)."""
        if not self.rows:
            return None
        arrays = [pa.array(self.cols[f.name], type=f.type) for f in self.arrow]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.arrow)
        self._reset()
        return batch
