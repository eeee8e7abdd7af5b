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


def message_schema(with_state: bool = False, columns: tuple[str, ...] | None = None) -> StructType:
    """One row per message; with ``state`` (pending, in_flight, acked, dead) for a consumer;
    only ``columns`` (in the schema's order) when given."""
    fields = list(_FIELDS)
    if with_state:
        fields.append(StructField(STATE_COLUMN, StringType(), False))
    if columns is not None:
        fields = [f for f in fields if f.name in columns]
    return StructType(fields)


def column_names(with_state: bool = False) -> list[str]:
    """Every column a read can return, in order."""
    return [f.name for f in _FIELDS] + ([STATE_COLUMN] if with_state else [])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema`` (timestamps in UTC microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:  # older pyspark without the timezone argument
        return to_arrow_schema(schema)


def _micros(ts: float) -> int:
    return round(ts * 1_000_000)


def _payload_text(value: Any) -> str | None:
    """A JSON payload as text; JSON ``null`` (or no payload) is SQL NULL, so ``payload IS NULL``
    finds it, and writing the row back stores ``null`` again."""
    if value is None:
        return None
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
        indexes = range(len(segment.records)) if keep is None else keep
        for name, values in self.cols.items():
            if name == STATE_COLUMN:
                values.extend(states if states is not None else ["pending"] * len(indexes))
                continue
            value = self._VALUES[name]
            values.extend(value(self, h, i, segment.records[i]) for i in indexes)
        self.rows += len(indexes)

    # each column's value for message ``i`` of a segment with header ``h``
    _VALUES: dict[str, Any] = {
        "id": lambda b, h, i, r: r.id,
        "topic": lambda b, h, i, r: b.topic,
        "partition": lambda b, h, i, r: h.partition,
        "seq": lambda b, h, i, r: h.seq,
        "index": lambda b, h, i, r: i,
        "offset": lambda b, h, i, r: h.base + i,
        "key": lambda b, h, i, r: r.key,
        "headers": lambda b, h, i, r: list(r.headers.items()),
        "payload": lambda b, h, i, r: _payload_text(r.payload) if r.data is None else None,
        "data": lambda b, h, i, r: r.data,
        "content_type": lambda b, h, i, r: r.content_type,
        "created_at": lambda b, h, i, r: _micros(r.created_at),
        "producer_id": lambda b, h, i, r: r.producer_id,
        "priority": lambda b, h, i, r: r.priority,
        "not_before": lambda b, h, i, r: _micros(r.not_before) if r.not_before is not None else None,
        "dedup_id": lambda b, h, i, r: r.dedup_id,
    }

    def flush(self) -> pa.RecordBatch | None:
        """The accumulated rows as one batch (None when empty)."""
        if not self.rows:
            return None
        arrays = [pa.array(self.cols[f.name], type=f.type) for f in self.arrow]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.arrow)
        self._reset()
        return batch
