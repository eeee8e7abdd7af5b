"""Write tasks: rows of the written DataFrame as the columns of chunks (core/chunks.py), per partition.

Every column is built by Arrow kernels when the DataFrame's column has the usual type (a JSON-text
``payload``, a string ``key``, a ``map<string,string>`` of ``headers``, timestamps): nothing per row
in Python. Other types (struct or number payloads, headers as JSON text, base64 ``data``, times as
text) are converted message by message, like :class:`~bucketq.spark.rows.RowMapper` does.

* ``payload`` is stored as the exact JSON text the row holds (validated in bulk: each text must be
  exactly one JSON value); NULL stays NULL (JSON ``null``). With ``payloadFormat=string`` each
  string becomes a JSON string. ``data`` wins over ``payload`` in a row that has both.
* Ids: kept from an ``id`` column (``keepIds``), else new UUIDv7s made in bulk (:class:`IdSource`).
* Partitions: a keyed row goes where the engine's producer would put it (``partition_for_key``);
  unkeyed rows are spread evenly, in contiguous runs (a task's partitions differ by at most one
  unkeyed row, whatever its batches).
"""

from __future__ import annotations

import base64
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator
from json.encoder import encode_basestring
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyspark.sql.types import BinaryType, DataType, MapType, StringType, StructType

from bucketq.core.chunks import arange, uuid_texts
from bucketq.core.producer import partition_for_key
from bucketq.core.segment import JSON_CONTENT_TYPE
from bucketq.errors import InvalidMessage, MessageTooLarge
from bucketq.spark.options import WriteConfig, parse_time
from bucketq.spark.rows import RowMapper, headers_converter, json_converter
from bucketq.spark.schema import POSITION_COLUMNS

OCTET_STREAM = "application/octet-stream"
TIMESTAMP = pa.timestamp("us", tz="UTC")
# What the engine's JSON line of a message adds to its payload, key and headers (ids, times,
# field names): a chunk message is checked against the topic's size limit as that line would be,
# so a consumer can always re-encode it (a dead-letter copy, a redrive).
ENVELOPE_BYTES = 230


# -- message ids -----------------------------------------------------------------------------------


class IdSource:
    """UUIDv7 message ids as 16-byte binaries, made by Arrow kernels, increasing within the task.

    48-bit unix milliseconds, then a 12-bit counter (RFC 9562 method 3: the clock moves on by one
    millisecond when the counter wraps), then 62 random bits: unique without coordination and
    ordered by creation, like the engine's ids.
    """

    def __init__(self) -> None:
        self.next_ms = 0

    def take(self, n: int) -> pa.Array:
        start = max(int(time.time() * 1000), self.next_ms)
        self.next_ms = start + (n >> 12) + 1
        counter = arange(n).cast(pa.uint64())
        # bytes 0-7, big-endian: 48 bits of milliseconds (one value per 4096 ids: spelled in Python),
        # then version 7 and the 12-bit counter (bytes 6 and 7: the top of the little-endian word)
        stamps = pa.array(
            [int.from_bytes((start + k).to_bytes(6, "big"), "little") for k in range((n >> 12) + 1)],
            pa.uint64(),
        )
        high = stamps.take(pc.shift_right(counter, _u64(12)))
        byte6 = pc.bit_wise_or(_u64(0x70), pc.bit_wise_and(pc.shift_right(counter, _u64(8)), _u64(0xF)))
        byte7 = pc.bit_wise_and(counter, _u64(0xFF))
        high = pc.bit_wise_or(
            high, pc.bit_wise_or(pc.shift_left(byte6, _u64(48)), pc.shift_left(byte7, _u64(56)))
        )
        # bytes 8-15: random, with the variant bits (10) at the top of byte 8 (its low byte here)
        low = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(os.urandom(8 * n))])
        low = pc.bit_wise_or(pc.bit_wise_and(low, _u64(0xFFFFFFFFFFFFFF3F)), _u64(0x80))
        both = pa.concat_arrays([high, low])
        pairs = arange(2 * n)
        order = pc.add(pc.multiply(pc.bit_wise_and(pairs, 1), n), pc.shift_right(pairs, 1))
        words = both.take(order)  # high0, low0, high1, low1, ...
        return (
            pa.Array.from_buffers(pa.binary(16), n, [None, words.buffers()[1]], offset=0)
            if n
            else pa.array([], pa.binary(16))
        )


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.uint64())


# -- JSON text -------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _one_json_value(text: str) -> bool:
    try:
        json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return False
    return True


def validated_json(texts: pa.Array) -> pa.Array:
    """``texts`` (nulls stay null) if every one is exactly one JSON value, else InvalidMessage.

    In bulk: each text goes on its own line as ``{"p":<text>}`` and the lines are parsed by Arrow's
    JSON reader. A text that is one JSON value yields one row with the single column ``p``; any
    other text fails the parse, adds rows (``1}{"p":2``) or adds a column (``1,"q":2``). When every
    text is an object (``{...}``, the usual payload) the texts themselves are the lines, and the
    reader only tokenizes them (no column is built): one row per text, or the batch is checked
    text by text. Batches
    the bulk check cannot settle (a text with a line break, a NaN/Infinity literal that Arrow
    accepts and JSON does not, values of mixed types) are checked text by text.
    """
    texts = texts.cast(pa.string())
    present = texts.filter(pc.is_valid(texts)) if texts.null_count else texts
    if len(present) == 0:
        return texts
    if not pc.any(pc.match_substring_regex(present, r"[\r\n]|NaN|Infinity")).as_py():
        objects = pc.all(pc.and_(pc.starts_with(present, "{"), pc.ends_with(present, "}"))).as_py()
        if objects:
            # every text an object, one per line: the reader's tokenizer checks them without
            # building a column (a line holding two objects, ``{}{}``, adds a row)
            ndjson = pc.binary_join_element_wise(present, "\n", "")
            parse = pajson.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
            want: list[str] = []
        else:
            ndjson = pc.binary_join_element_wise('{"p":', present, "}\n", "")
            parse = pajson.ParseOptions()
            want = ["p"]
        body = _joined(ndjson)
        try:
            table = pajson.read_json(
                pa.BufferReader(body),
                read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(body) + 1)),
                parse_options=parse,
            )
            if table.num_rows == len(present) and table.column_names == want:
                return texts
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass
    for text in present.to_pylist():
        if not _one_json_value(text):
            raise InvalidMessage(
                f"payload {text[:60]!r} is not JSON text (use option payloadFormat=string to send "
                "strings as they are)"
            )
    return texts


def _null_for_json_null(texts: pa.Array) -> pa.Array:
    """JSON ``null`` as a null payload: the engine's records do not tell the two apart, and a read
    returns SQL NULL for both (``payload IS NULL`` finds them)."""
    if len(texts) == 0:
        return texts
    is_null = pc.equal(pc.utf8_trim_whitespace(texts), "null")
    if not pc.any(is_null).as_py():
        return texts
    return pc.if_else(is_null, pa.scalar(None, pa.string()), texts)


def _joined(strings: pa.Array) -> pa.Buffer:
    """The bytes of a string array's values, end to end (no copy)."""
    offsets = pa.Array.from_buffers(
        pa.int32(), len(strings) + 1, [None, strings.buffers()[1]], offset=strings.offset
    )
    lo, hi = offsets[0].as_py(), offsets[len(strings)].as_py()
    data = strings.buffers()[2]
    return data.slice(lo, hi - lo) if data is not None else pa.py_buffer(b"")


def json_strings(values: pa.Array) -> pa.Array:
    """Each string as JSON text (a JSON string literal); nulls stay null."""
    values = values.cast(pa.string())
    needs = pc.match_substring_regex(pc.fill_null(values, ""), r'["\\\x00-\x1f\x7f]')
    if not pc.any(needs).as_py():
        return pc.binary_join_element_wise('"', values, '"', "")
    return pa.array(
        [None if v is None else str(encode_basestring(v)) for v in values.to_pylist()], pa.string()
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_texts(values: pa.Array, convert: Callable[[Any], Any]) -> pa.Array:
    """Values of any Spark type as JSON text, message by message (nulls stay null)."""
    out: list[str | None] = []
    for value in values.to_pylist():
        if value is None:
            out.append(None)
            continue
        try:
            out.append(_dumps(convert(value)))
        except (TypeError, ValueError) as exc:
            raise InvalidMessage(f"payload is not JSON-serialisable: {exc}") from None
    return pa.array(out, pa.string())


def headers_json(values: pa.Array, dt: DataType) -> pa.Array:
    """A ``headers`` column as JSON object text (string keys and values, null entries dropped).

    A ``map<string,string>`` without null values is built by kernels: each entry becomes
    ``"k":"v"`` and the entries of a row are joined; anything else row by row.
    """
    if isinstance(dt, MapType) and isinstance(values, pa.MapArray):
        keys, items = values.keys.cast(pa.string()), values.items.cast(pa.string())
        if items.null_count == 0 and values.null_count == 0:
            pieces = pc.binary_join_element_wise(json_strings(keys), json_strings(items), ":")
            rows = pa.ListArray.from_arrays(values.offsets, pieces)
            return pc.binary_join_element_wise("{", pc.binary_join(rows, ","), "}", "")
    convert = headers_converter(dt)
    return pa.array([_dumps(convert(v)) for v in values.to_pylist()], pa.string())


# -- times -----------------------------------------------------------------------------------------


def timestamps(values: pa.Array, what: str) -> pa.Array:
    """A time column (timestamp, unix seconds or text) as ``timestamp[us, UTC]`` (nulls stay null)."""
    t = values.type
    if pa.types.is_timestamp(t):
        return values.cast(pa.timestamp("us", tz=t.tz or "UTC")).cast(TIMESTAMP)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        micros = pc.round(pc.multiply(values.cast(pa.float64()), 1_000_000.0))
        return micros.cast(pa.int64()).cast(TIMESTAMP)
    if pa.types.is_date(t):
        return values.cast(pa.timestamp("us")).cast(TIMESTAMP)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        parsed = [None if v is None else round(parse_time(v, what) * 1_000_000) for v in values.to_pylist()]
        return pa.array(parsed, pa.int64()).cast(TIMESTAMP)
    raise InvalidMessage(f"column {what} must be a timestamp or unix seconds, not {t}")


# -- the encoder -----------------------------------------------------------------------------------


class ChunkEncoder:
    """Turns Arrow batches of the written DataFrame into per-partition tables of chunk columns.

    A column the DataFrame does not have and that would be the same for every message (the run's
    producer id; the JSON content type) is left out: it is the chunk's default (:meth:`defaults`).
    """

    def __init__(self, schema: StructType, cfg: WriteConfig, task: int) -> None:
        self.cfg = cfg
        self.mapper = RowMapper(schema, cfg)  # validates the columns (as on the driver)
        self.types = {f.name: f.dataType for f in schema.fields if f.name not in POSITION_COLUMNS}
        self.present = self.mapper.present
        self.ids = IdSource()
        self.spread = task % max(1, cfg.partitions)  # where this task's next unkeyed run starts
        self._partitions: dict[str, int] = {}

    def defaults(self) -> dict[str, Any]:
        """What a chunk of this encoder's tables stores once for the columns they leave out."""
        return {"producer_id": self.cfg.producer_id or None, "content_type": JSON_CONTENT_TYPE}

    def encode(self, batch: pa.RecordBatch) -> Iterator[tuple[int, pa.Table]]:
        """``(partition, table)`` for the batch's rows, in row order within each partition."""
        n = batch.num_rows
        if n == 0:
            return
        table = self._columns(batch)
        yield from self._split(table)

    # -- columns

    def _get(self, batch: pa.RecordBatch, name: str) -> pa.Array | None:
        if name not in self.present:
            return None
        col = batch.column(name)
        return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col

    def _columns(self, batch: pa.RecordBatch) -> pa.Table:
        n = batch.num_rows
        cols: dict[str, pa.Array] = {}
        data = self._data(batch)
        payload = self._payload(batch)
        if data is not None and payload is not None:
            payload = pc.if_else(pc.is_valid(data), pa.scalar(None, pa.string()), payload)
        if payload is None:
            payload = pa.nulls(n, pa.string())
        ids = self._ids(batch)
        cols["id"] = ids
        key = self._get(batch, "key")
        if key is not None:
            cols["key"] = key if pa.types.is_string(key.type) else self._as_text(key)
        headers = self._get(batch, "headers")
        if headers is not None:
            cols["headers"] = headers_json(headers, self.types["headers"])
        cols["payload"] = payload
        if data is not None:
            cols["data"] = data
        if data is not None or "content_type" in self.present:
            cols["content_type"] = self._content_type(batch, data)  # else JSON: the chunk's default
        created = self._get(batch, "created_at")
        now = pa.scalar(round(time.time() * 1_000_000), pa.int64()).cast(TIMESTAMP)
        cols["created_at"] = (
            pc.fill_null(timestamps(created, "created_at"), now) if created is not None else pa.repeat(now, n)
        )
        producer = self._get(batch, "producer_id")
        if producer is not None:  # else the run's producer: the chunk's default
            default_producer = pa.scalar(self.cfg.producer_id or None, pa.string())
            cols["producer_id"] = pc.fill_null(producer.cast(pa.string()), default_producer)
        priority = self._get(batch, "priority")
        if priority is not None:
            cols["priority"] = pc.fill_null(priority.cast(pa.int32()), 0)
        not_before = self._get(batch, "not_before")
        if not_before is not None:
            cols["not_before"] = timestamps(not_before, "not_before")
        dedup = self._get(batch, "dedup_id")
        if dedup is not None:
            dedup = dedup.cast(pa.string())
            if pc.any(pc.equal(dedup, "")).as_py():
                raise InvalidMessage("dedup_id must be a non-empty string")
            cols["dedup_id"] = dedup
        self._check_sizes(cols)
        return pa.table(cols)

    def _as_text(self, values: pa.Array) -> pa.Array:
        try:
            return values.cast(pa.string())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            return pa.array([None if v is None else str(v) for v in values.to_pylist()], pa.string())

    def _ids(self, batch: pa.RecordBatch) -> pa.Array:
        given = self._get(batch, "id") if self.cfg.keep_ids else None
        if given is None:
            return self.ids.take(batch.num_rows)
        given = self._as_text(given)
        if given.null_count:
            return pc.if_else(pc.is_null(given), uuid_texts(self.ids.take(batch.num_rows)), given)
        return given

    def _payload(self, batch: pa.RecordBatch) -> pa.Array | None:
        if self.mapper.row_columns:  # no payload or data column: each row's columns as an object
            rows = batch.select(self.mapper.row_columns).to_pylist()
            convert = self.mapper.row_convert
            return pa.array([_dumps({k: convert[k](v) for k, v in r.items()}) for r in rows], pa.string())
        values = self._get(batch, "payload")
        if values is None:
            return None
        dt = self.types["payload"]
        if isinstance(dt, StringType):
            if self.cfg.payload_format == "string":
                return json_strings(values)
            return _null_for_json_null(validated_json(values))
        return _null_for_json_null(json_texts(values, json_converter(dt)))

    def _data(self, batch: pa.RecordBatch) -> pa.Array | None:
        values = self._get(batch, "data")
        if values is None:
            return None
        if isinstance(self.types["data"], BinaryType):
            return values.cast(pa.binary())
        try:
            return pa.array(
                [None if v is None else base64.b64decode(v, validate=True) for v in values.to_pylist()],
                pa.binary(),
            )
        except ValueError as exc:
            raise InvalidMessage(f"column data must be binary or base64 text: {exc}") from None

    def _content_type(self, batch: pa.RecordBatch, data: pa.Array | None) -> pa.Array:
        n = batch.num_rows
        if data is None:
            default = pa.repeat(pa.scalar(JSON_CONTENT_TYPE), n)
        else:
            default = pc.if_else(pc.is_valid(data), pa.scalar(OCTET_STREAM), pa.scalar(JSON_CONTENT_TYPE))
        given = self._get(batch, "content_type")
        return default if given is None else pc.coalesce(given.cast(pa.string()), default)

    def _check_sizes(self, cols: dict[str, pa.Array]) -> None:
        """Every message within the topic's size limit, measured as the engine's JSON line."""
        size = pc.fill_null(pc.binary_length(cols["payload"]), 4)
        if "data" in cols:  # base64 in a JSON line
            b64 = pc.multiply(pc.divide(pc.add(pc.fill_null(pc.binary_length(cols["data"]), 0), 2), 3), 4)
            size = pc.add(size, b64)
        for name in ("key", "headers", "dedup_id"):
            if name in cols:
                size = pc.add(size, pc.fill_null(pc.binary_length(cols[name]), 0))
        size = pc.add(size, ENVELOPE_BYTES)
        too_big = pc.greater(size, self.cfg.max_message_bytes)
        if pc.any(too_big).as_py():
            first = pc.index(too_big, True).as_py()
            raise MessageTooLarge(size[first].as_py(), self.cfg.max_message_bytes)

    # -- partitions

    def _partition_of(self, key: str) -> int:
        p = self._partitions.get(key)
        if p is None:
            if len(self._partitions) > 100_000:
                self._partitions.clear()
            p = self._partitions[key] = partition_for_key(key, self.cfg.partitions)
        return p

    def _split(self, table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
        parts = self.cfg.partitions
        n = table.num_rows
        keys = table.column("key").combine_chunks() if "key" in table.column_names else None
        if keys is None or keys.null_count == n:
            for p, start, length in self._spread(n):
                yield p, table.slice(start, length)
            return
        encoded = pc.dictionary_encode(keys)
        by_key = pa.array([self._partition_of(k) for k in encoded.dictionary.to_pylist()], pa.int32())
        target = by_key.take(encoded.indices)  # null where unkeyed
        if keys.null_count:
            unkeyed = pc.is_null(keys)
            runs = pa.array(
                [p for p, _, length in self._spread(keys.null_count) for _ in range(length)], pa.int32()
            )
            positions = pc.subtract(pc.cumulative_sum(unkeyed.cast(pa.int64())), 1)
            target = pc.if_else(unkeyed, runs.take(pc.if_else(unkeyed, positions, 0)), target)
        if parts == 1 or pc.all(pc.equal(target, target[0])).as_py():
            yield target[0].as_py(), table
            return
        order = pc.sort_indices(target)  # stable: rows keep their order within a partition
        ordered = table.take(order)
        counts = pc.value_counts(target)
        sizes = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))
        start = 0
        for p in sorted(sizes):
            yield p, ordered.slice(start, sizes[p])
            start += sizes[p]

    def _spread(self, n: int) -> list[tuple[int, int, int]]:
        """``(partition, start, length)`` runs spreading ``n`` unkeyed rows evenly: each partition
        gets ``n // P`` rows, the ``n % P`` extra ones go to the partitions after the last batch's."""
        parts = self.cfg.partitions
        q, r = divmod(n, parts)
        out, start = [], 0
        for j in range(parts):
            length = q + (1 if j < r else 0)
            if length:
                out.append(((self.spread + j) % parts, start, length))
            start += length
        self.spread = (self.spread + r) % parts
        return out


# -- the input's fingerprint: a rerun of a committed job can tell whether its input changed ---------


def fingerprint(batch: pa.RecordBatch, crc: int = 0) -> int:
    """A CRC-32 of the batch's values, updated from ``crc`` (independent of Arrow's memory layout:
    only values and nulls count, never padding or what lies under a null)."""
    for column in batch.columns:
        crc = _crc_array(column, crc)
    return crc


def _crc_array(arr: pa.Array, crc: int) -> int:
    t = arr.type
    n = len(arr)
    if isinstance(t, pa.DictionaryType):
        return _crc_array(arr.dictionary_decode(), crc)
    if (
        pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
    ):
        lengths = pc.fill_null(pc.binary_length(arr), -1).cast(pa.int64())
        crc = zlib.crc32(_exact(lengths, 8 * n), crc)
        present = arr.filter(pc.is_valid(arr)) if arr.null_count else arr
        return zlib.crc32(_joined(present.cast(pa.binary())).to_pybytes(), crc) if len(present) else crc
    if isinstance(t, pa.StructType):
        crc = zlib.crc32(_exact(pc.is_null(arr).cast(pa.int8()), n), crc)
        for i in range(t.num_fields):
            crc = _crc_array(arr.field(i), crc)
        return crc
    if isinstance(t, pa.ListType | pa.LargeListType | pa.MapType):
        offsets = arr.offsets.cast(pa.int64())
        lengths = pc.subtract(offsets.slice(1), offsets.slice(0, n))
        lengths = pc.if_else(pc.is_null(arr), -1, lengths) if arr.null_count else lengths
        crc = zlib.crc32(_exact(lengths, 8 * n), crc)
        lo, hi = offsets[0].as_py(), offsets[n].as_py()
        return _crc_array(arr.values.slice(lo, hi - lo), crc)  # a map's values: (key, value) structs
    if t.bit_width and t.bit_width >= 8:
        crc = zlib.crc32(_exact(pc.is_null(arr).cast(pa.int8()), n), crc)
        filled = pc.fill_null(arr, pa.scalar(0).cast(t)) if arr.null_count else arr
        return zlib.crc32(_exact(filled, n * t.bit_width // 8), crc)
    if pa.types.is_boolean(t):
        return zlib.crc32(_exact(pc.fill_null(arr, False).cast(pa.int8()), n), crc)
    return zlib.crc32(repr(arr.to_pylist()).encode(), crc)


def _exact(arr: pa.Array, nbytes: int) -> bytes:
    """The first ``nbytes`` value bytes of a fixed-width array (never its padding)."""
    buf = arr.buffers()[1]
    width = nbytes // max(1, len(arr)) if len(arr) else 0
    return buf.slice(arr.offset * width, nbytes).to_pybytes() if buf is not None and nbytes else b""
