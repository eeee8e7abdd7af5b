"""DataFrame rows to engine records: the writer's column mapping.

* ``payload``: a string column holds JSON text (``payloadFormat=string``: a plain string value);
  struct, map, array and scalar columns become the matching JSON.
* ``data`` (binary, or base64 text as in a JSON export) instead of ``payload`` for raw bytes.
* Without ``payload`` and ``data``, each row's other columns become a JSON object payload.
* Optional ``key``, ``headers`` (map, struct or JSON object text), ``id``, ``content_type``,
  ``created_at`` and ``not_before`` (timestamp or unix seconds), ``priority``, ``producer_id``,
  ``dedup_id`` (stored, not enforced). Position columns of a read (topic, partition, seq,
  index, offset, state) are ignored, so a read DataFrame can be written back as it is.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
)

from bucketq.core.chunks import COLUMNS
from bucketq.core.segment import Record, build_record
from bucketq.errors import InvalidMessage
from bucketq.spark.options import WriteConfig, parse_time
from bucketq.spark.schema import POSITION_COLUMNS

FIELD_COLUMNS = COLUMNS  # a message's fields: the columns of a chunk
Convert = Callable[[Any], Any]


def _json_value(value: Any) -> Any:
    """A Python value from Arrow as JSON-compatible data."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    return value


def json_converter(dt: DataType) -> Convert:
    """A function turning an Arrow ``to_pylist`` value of Spark type ``dt`` into JSON data."""
    if isinstance(dt, MapType):
        conv_v = json_converter(dt.valueType)
        return lambda v: None if v is None else {str(_json_value(k)): conv_v(x) for k, x in v}
    if isinstance(dt, StructType):
        convs = [(f.name, json_converter(f.dataType)) for f in dt.fields]
        return lambda v: None if v is None else {name: c(v.get(name)) for name, c in convs}
    if isinstance(dt, ArrayType):
        conv_e = json_converter(dt.elementType)
        return lambda v: None if v is None else [conv_e(x) for x in v]
    return _json_value


def _seconds(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return parse_time(value, what)
    raise InvalidMessage(f"column {what} must be a timestamp or unix seconds, got {type(value).__name__}")


def headers_converter(dt: DataType) -> Convert:
    """Turns a ``headers`` value (map, struct or JSON object text) into a string dict."""
    if isinstance(dt, StringType):

        def parse(v: Any) -> dict[str, str]:
            obj = json.loads(v) if v else {}
            if not isinstance(obj, dict):
                raise InvalidMessage("column headers must hold a JSON object")
            return {str(k): str(x) for k, x in obj.items() if x is not None}

        return parse
    if isinstance(dt, MapType):
        return lambda v: {str(k): str(x) for k, x in (v or []) if x is not None}
    if isinstance(dt, StructType):
        return lambda v: {str(k): str(x) for k, x in (v or {}).items() if x is not None}
    raise InvalidMessage(f"column headers must be a map, struct or JSON string, not {dt.simpleString()}")


class RowMapper:
    """Builds records from Arrow batches of a DataFrame with ``schema`` (validated on the driver)."""

    def __init__(self, schema: StructType, cfg: WriteConfig) -> None:
        self.cfg = cfg
        names = schema.fieldNames()
        types = {f.name: f.dataType for f in schema.fields}
        self.present = {c for c in FIELD_COLUMNS if c in names}
        extra = [n for n in names if n not in FIELD_COLUMNS and n not in POSITION_COLUMNS]
        if ("payload" in self.present or "data" in self.present) and extra:
            raise InvalidMessage(
                f"columns {extra} are not message fields: drop them, or drop 'payload'/'data' "
                "to send each row's columns as a JSON object"
            )
        self.row_columns = extra if not ({"payload", "data"} & self.present) else []
        self.row_convert = {n: json_converter(types[n]) for n in self.row_columns}
        self.payload = self._payload(types["payload"]) if "payload" in self.present else None
        self.data = self._data(types["data"]) if "data" in self.present else None
        self.headers = headers_converter(types["headers"]) if "headers" in self.present else None

    def _payload(self, dt: DataType) -> Convert:
        if isinstance(dt, StringType) and self.cfg.payload_format == "json":

            def parse(v: Any) -> Any:
                try:
                    return json.loads(v) if v is not None else None
                except ValueError:
                    raise InvalidMessage(
                        f"payload {v[:60]!r} is not JSON text (use option payloadFormat=string "
                        "to send strings as they are)"
                    ) from None

            return parse
        return json_converter(dt)

    @staticmethod
    def _data(dt: DataType) -> Convert:
        if isinstance(dt, BinaryType):
            return lambda v: bytes(v) if v is not None else None
        if isinstance(dt, StringType):
            return lambda v: base64.b64decode(v) if v is not None else None
        raise InvalidMessage(f"column data must be binary or base64 text, not {dt.simpleString()}")

    def records(self, batch: pa.RecordBatch) -> Iterator[Record]:
        cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        for i in range(batch.num_rows):
            yield self._record(cols, i)

    def _record(self, cols: dict[str, list[Any]], i: int) -> Record:
        def get(name: str) -> Any:
            return cols[name][i] if name in self.present else None

        data = self.data(get("data")) if self.data is not None else None  # data wins over payload
        if self.payload is not None and data is None:
            payload = self.payload(get("payload"))
        elif self.row_columns:
            payload = {n: self.row_convert[n](cols[n][i]) for n in self.row_columns}
        else:
            payload = None
        key = get("key")
        priority = get("priority")
        return build_record(
            payload,
            data=data,
            content_type=get("content_type"),
            key=str(key) if key is not None else None,
            headers=self.headers(get("headers")) if self.headers is not None else None,
            producer_id=get("producer_id") or self.cfg.producer_id,
            priority=int(priority) if priority is not None else 0,
            not_before=_seconds(get("not_before"), "not_before"),
            dedup_id=get("dedup_id"),
            id=get("id") if self.cfg.keep_ids else None,
            created_at=_seconds(get("created_at"), "created_at"),
        )
