"""Columnar chunks (format 5): messages of a bulk write as one Arrow IPC file with typed columns.

A write job's tasks write each chunk once, at its final key ``R/{topic}/chunk/{name}``; the job
commit makes chunks part of a partition by appending a *reference segment* that names them
(:mod:`bucketq.core.refsegment`). A chunk is never rewritten: readers check its ETag.

The file's schema metadata ``bucketq.chunk`` holds the chunk format version, ``bucketq.defaults``
a JSON object of per-chunk constants. Columns (every one but ``id`` and ``created_at`` may be
left out; a missing column holds its default, or null, for every row):

======================  ==========================================================================
``id``                  ``fixed_size_binary(16)`` (the UUID's bytes), or ``utf8`` when an id in the
                        chunk is not a canonical lower-case UUID (kept exactly as given)
``key``                 ``dictionary<int32, utf8>`` or ``utf8``, null = unkeyed
``headers``             ``dictionary<int32, utf8>`` or ``utf8`` of JSON object text (default ``{}``)
``payload``             ``utf8``: the payload's exact JSON text (a read hands it out as stored);
                        null = JSON ``null``, or the message carries ``data``
``data``                ``binary``: raw bytes (the message has no JSON payload)
``content_type``        ``dictionary<int32, utf8>`` or ``utf8``
``created_at``          ``timestamp[us, UTC]``
``producer_id``         ``dictionary<int32, utf8>`` or ``utf8``
``priority``            ``int32`` (default 0)
``not_before``          ``timestamp[us, UTC]``, null = deliverable at once
``dedup_id``            ``utf8``
======================  ==========================================================================

Arrow is imported only when a chunk is read or written: ``import bucketq`` stays light.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bucketq.core.segment import JSON_CONTENT_TYPE, Record, UnsupportedSegment
from bucketq.errors import StorageError

if TYPE_CHECKING:
    import pyarrow as pa

CHUNK_VERSION = 1
VERSION_KEY = b"bucketq.chunk"
DEFAULTS_KEY = b"bucketq.defaults"
CHUNK_SUFFIX = ".arrow"
COMPRESSIONS = ("zstd",)

COLUMNS = (
    "id",
    "key",
    "headers",
    "payload",
    "data",
    "content_type",
    "created_at",
    "producer_id",
    "priority",
    "not_before",
    "dedup_id",
)
REQUIRED = ("id", "created_at")
# columns of repeated strings: dictionary-encoded in a chunk (a constant one goes to the defaults)
DICTIONARY_COLUMNS = ("key", "headers", "content_type", "producer_id")
DEFAULTS: dict[str, Any] = {"headers": "{}", "content_type": JSON_CONTENT_TYPE, "priority": 0}
CANONICAL_UUID = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class CorruptChunk(StorageError):
    """A chunk that cannot be decoded, is missing, or is not the one its reference segment names."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """A chunk as a reference segment (and its transaction's manifest) names it.

    ``name`` is the chunk's path under ``R/{topic}/chunk/``; ``min_us``/``max_us`` the range of
    its messages' ``created_at`` (unix microseconds), for time-filtered reads to skip whole chunks.
    """

    name: str
    etag: str
    count: int
    bytes: int
    min_us: int
    max_us: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "etag": self.etag,
            "count": self.count,
            "bytes": self.bytes,
            "min_us": self.min_us,
            "max_us": self.max_us,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ChunkRef:
        try:
            return cls(
                str(obj["name"]),
                str(obj["etag"]),
                int(obj["count"]),
                int(obj.get("bytes", 0)),
                int(obj["min_us"]),
                int(obj["max_us"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptChunk(f"bad chunk reference {obj!r}: {exc}") from None


def arrow() -> Any:
    """The pyarrow module, or :class:`UnsupportedSegment` naming the package to install."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
    except ImportError:
        raise UnsupportedSegment(
            "this topic holds columnar chunks (written by a bulk write job); reading them needs "
            "pyarrow: pip install pyarrow"
        ) from None
    return pyarrow


def same_etag(a: str, b: str) -> bool:
    """ETags compare without the quotes some stores add."""
    return a.strip('"') == b.strip('"')


# -- ids -------------------------------------------------------------------------------------------

# Two hex digits of each byte value as one little-endian uint16 (the digits in text order)
_HEX_PAIRS: list[int] = [ord(f"{i:02x}"[0]) | (ord(f"{i:02x}"[1]) << 8) for i in range(256)]
_DIGITS = "0123456789abcdef"
_UUID_SPANS = ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32))
_tables: dict[str, Any] = {}


def _table(name: str) -> Any:
    """Lookup tables for the id conversions, built once per process."""
    if name not in _tables:
        pa = arrow()
        if name == "hex":
            _tables[name] = pa.array(_HEX_PAIRS, pa.uint16())
        else:  # "unhex": a pair of hex digits (as a little-endian uint16) -> the byte they spell
            values = []
            for v in range(65536):
                hi, lo = chr(v & 0xFF), chr(v >> 8)
                values.append(
                    _DIGITS.index(hi) << 4 | _DIGITS.index(lo) if hi in _DIGITS and lo in _DIGITS else 0
                )
            _tables[name] = pa.array(values, pa.uint8())
    return _tables[name]


def uuid_texts(ids: pa.Array) -> pa.Array:
    """Canonical UUID texts (``8-4-4-4-12`` lower-case hex) of a ``fixed_size_binary(16)`` array,
    by Arrow kernels: each byte becomes its two digits through a lookup table, then the dashes."""
    pa = arrow()
    pc = pa.compute
    n = len(ids)
    if n == 0:
        return pa.array([], pa.string())
    data = ids.buffers()[1]
    octets = pa.Array.from_buffers(pa.uint8(), 16 * n, [None, data], offset=16 * ids.offset)
    digits = _table("hex").take(octets)
    packed = pa.Array.from_buffers(pa.binary(32), n, [None, digits.buffers()[1]]).cast(pa.binary())
    parts = [pc.binary_slice(packed, start, stop) for start, stop in _UUID_SPANS]
    texts = pc.binary_join_element_wise(*parts, b"-").view(pa.string())
    return texts if ids.null_count == 0 else pc.if_else(pc.is_null(ids), pa.scalar(None, pa.string()), texts)


def uuid_bytes(texts: pa.Array) -> pa.Array | None:
    """The ``fixed_size_binary(16)`` form of an array of canonical UUID texts, or None when any
    text is null or not a canonical lower-case UUID (those must be kept as text, exactly)."""
    pa = arrow()
    pc = pa.compute
    n = len(texts)
    if n == 0 or texts.null_count:
        return None
    texts = texts.cast(pa.string())
    if not pc.all(pc.match_substring_regex(texts, CANONICAL_UUID)).as_py():
        return None
    packed = pc.replace_substring(texts, "-", "")  # a new array: 32 digits per row from offset 0
    pairs = pa.Array.from_buffers(pa.uint16(), 16 * n, [None, packed.buffers()[2]])
    octets = _table("unhex").take(pairs)
    return pa.Array.from_buffers(pa.binary(16), n, [None, octets.buffers()[1]])


_ARANGE: list[Any] = []


def arange(n: int) -> pa.Array:
    """0, 1, ..., n-1 as int64 (a slice of one cached array while it is long enough)."""
    pa = arrow()
    if not _ARANGE or len(_ARANGE[0]) < n:
        size = max(n, 1 << 17)
        _ARANGE[:] = [
            pa.compute.subtract(pa.compute.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), size)), 1)
        ]
    return _ARANGE[0].slice(0, n)


# -- writing ---------------------------------------------------------------------------------------


def _constant(column: pa.Array) -> tuple[bool, Any]:
    """Whether every value of ``column`` is the same (nulls included), and that value."""
    pc = arrow().compute
    if len(column) == 0:
        return True, None
    if column.null_count == len(column):
        return True, None
    if column.null_count:
        return False, None
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return low == high, low


def encode_chunk(
    table: pa.Table, *, compression: str | None = "zstd", defaults: dict[str, Any] | None = None
) -> bytes:
    """The chunk file of ``table`` (columns named as in :data:`COLUMNS`, plain Arrow types).

    Constant columns move to the defaults (a producer id, a content type written once per chunk,
    not per message), repeated strings are dictionary-encoded, ids become 16-byte binaries when
    they all are canonical UUIDs. ``compression``: Arrow IPC buffer compression (``zstd``) or None.
    ``defaults``: the values of columns ``table`` leaves out (a writer that knows them constant).
    """
    pa = arrow()
    pc = pa.compute
    unknown = [c for c in table.column_names if c not in COLUMNS]
    missing = [c for c in REQUIRED if c not in table.column_names]
    if unknown or missing:
        raise ValueError(f"chunk columns: unknown {unknown}, missing {missing}")
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(f"unknown chunk compression {compression!r}: use one of {COMPRESSIONS}")
    values = dict(defaults or {})
    fields, arrays = [], []
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if isinstance(column.type, pa.DictionaryType):
            column = column.dictionary_decode()
        if name == "id":
            if pa.types.is_fixed_size_binary(column.type):
                pass
            else:
                binary = uuid_bytes(column)
                column = binary if binary is not None else column.cast(pa.string())
        elif name == "data":
            if column.null_count == len(column):
                continue  # no raw bytes in this chunk
        elif name in DICTIONARY_COLUMNS or name in ("priority", "not_before", "dedup_id"):
            constant, value = _constant(column)
            if constant:
                if value is not None:
                    values[name] = value
                elif name in DEFAULTS:
                    values[name] = None  # null everywhere: not the column's default
                continue
            if name in DICTIONARY_COLUMNS:
                column = pc.dictionary_encode(column.cast(pa.string()))
        fields.append(pa.field(name, column.type))
        arrays.append(column)
    metadata = {VERSION_KEY: str(CHUNK_VERSION).encode()}
    if values:
        metadata[DEFAULTS_KEY] = json.dumps(values, separators=(",", ":"), default=_json_default).encode()
    out = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, out.schema, options=options) as writer:
        writer.write_table(out)  # one record batch: a reader's columns are contiguous, never copied
    return bytes(sink.getvalue())


def _json_default(value: Any) -> Any:
    if hasattr(value, "timestamp"):  # a timestamp default (not_before): unix microseconds
        return round(value.timestamp() * 1_000_000)
    raise TypeError(f"cannot store {value!r} as a chunk default")


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """A decoded chunk: its table (only the requested columns that it stores) and its defaults."""

    table: Any  # pa.Table (typed Any: pyarrow is imported lazily)
    defaults: dict[str, Any]

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    def has(self, column: str) -> bool:
        return column in self.table.column_names

    def default(self, column: str) -> Any:
        """The value of ``column`` for every row, when the chunk does not store the column."""
        return self.defaults.get(column, DEFAULTS.get(column))


def decode_chunk(data: bytes, columns: Sequence[str] | None = None, *, what: str = "chunk") -> Chunk:
    """The chunk in ``data``, with only ``columns`` (None: all) decompressed.

    Raises :class:`UnsupportedSegment` for a chunk of a newer format (I19: refused, never taken
    for a corrupt chunk), :class:`CorruptChunk` for bytes that are not a chunk.
    """
    pa = arrow()
    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        metadata = reader.schema.metadata or {}
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise CorruptChunk(f"{what} is not an Arrow IPC file: {exc}") from None
    try:
        version = int(metadata.get(VERSION_KEY, b"0"))
    except ValueError:
        version = 0
    if version < 1:
        raise CorruptChunk(f"{what} is not a bucketq chunk (no {VERSION_KEY.decode()} metadata)")
    if version > CHUNK_VERSION:
        raise UnsupportedSegment(
            f"{what} is chunk format {version}; this bucketq reads up to {CHUNK_VERSION}: upgrade bucketq"
        )
    try:
        defaults = json.loads(metadata.get(DEFAULTS_KEY, b"{}"))
        names = reader.schema.names
        if columns is not None:
            wanted = [i for i, name in enumerate(names) if name in set(columns)]
            reader = pa.ipc.open_file(
                pa.py_buffer(data), options=pa.ipc.IpcReadOptions(included_fields=wanted)
            )
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError) as exc:
        raise CorruptChunk(f"{what} cannot be decoded: {exc}") from None
    return Chunk(table, dict(defaults))


def _pylist(chunk: Chunk, column: str) -> list[Any]:
    """A column as Python values, the default filled in where the chunk does not store it."""
    if chunk.has(column):
        pa = arrow()
        col = chunk.table.column(column)
        if column == "id" and pa.types.is_fixed_size_binary(col.type):
            return [None if b is None else str(uuid.UUID(bytes=b)) for b in col.to_pylist()]
        if pa.types.is_timestamp(col.type):  # unix microseconds, exactly
            return list(col.cast(pa.int64()).to_pylist())
        return list(col.to_pylist())
    return [chunk.default(column)] * chunk.rows


def chunk_records(chunk: Chunk) -> list[Record]:
    """The chunk's messages as engine records (one Python object per message: for consumers, not
    for bulk reads, which stay columnar)."""
    n = chunk.rows
    cols = {name: _pylist(chunk, name) for name in COLUMNS}
    parsed: dict[str, dict[str, str]] = {}
    out = []
    for i in range(n):
        data = cols["data"][i]
        text = cols["payload"][i]
        headers_text = cols["headers"][i] or "{}"
        headers = parsed.get(headers_text)
        if headers is None:
            headers = parsed[headers_text] = {str(k): str(v) for k, v in json.loads(headers_text).items()}
        created = cols["created_at"][i]
        not_before = cols["not_before"][i]
        out.append(
            Record(
                id=cols["id"][i],
                key=cols["key"][i],
                headers=dict(headers),
                payload=json.loads(text) if data is None and text is not None else None,
                data=bytes(data) if data is not None else None,
                content_type=cols["content_type"][i] or JSON_CONTENT_TYPE,
                created_at=_seconds(created) or 0.0,
                producer_id=cols["producer_id"][i],
                priority=int(cols["priority"][i] or 0),
                not_before=_seconds(not_before),
                dedup_id=cols["dedup_id"][i],
            )
        )
    return out


def _seconds(micros: int | None) -> float | None:
    """Unix seconds of a timestamp column's value (unix microseconds)."""
    return None if micros is None else micros / 1_000_000
