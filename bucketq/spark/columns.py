"""A decoded chunk as an Arrow batch of the read's schema, by Arrow kernels (no Python per row).

Payloads are handed out as stored (their exact JSON text: a slice, never parsed or written
again), ids turned into UUID text through a lookup table, position columns computed from the
reference segment's place, repeated strings decoded from their dictionaries, and the ``since``
/ ``until`` window applied as a filter on ``created_at``. Only the consumer ``state`` column
needs a label per message (it asks the consumer's cursor).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bucketq.core.chunks import Chunk, arange, uuid_texts
from bucketq.core.partition_worker import REDRIVE_FOR_HEADER
from bucketq.spark.options import ReadConfig
from bucketq.spark.planning import ChunkItem
from bucketq.spark.schema import STATE_COLUMN

# the chunk columns each output column is made from (position columns need none)
SOURCES: dict[str, tuple[str, ...]] = {
    "id": ("id",),
    "key": ("key",),
    "headers": ("headers",),
    "payload": ("payload", "data"),
    "data": ("data",),
    "content_type": ("content_type",),
    "created_at": ("created_at",),
    "producer_id": ("producer_id",),
    "priority": ("priority",),
    "not_before": ("not_before",),
    "dedup_id": ("dedup_id",),
    STATE_COLUMN: ("headers",),
}


def chunk_columns(names: list[str], cfg: ReadConfig) -> list[str]:
    """The chunk columns a read of output columns ``names`` decodes (``created_at`` for a window)."""
    wanted = {c for name in names for c in SOURCES.get(name, ())}
    if cfg.since is not None or cfg.until is not None:
        wanted.add("created_at")
    return sorted(wanted)


def window(created: pa.Array, cfg: ReadConfig) -> pa.Array | None:
    """The rows inside the read's ``since``/``until`` window (None: no window)."""
    if cfg.since is None and cfg.until is None:
        return None
    micros = created.cast(pa.int64())
    keep = None
    if cfg.since is not None:
        lo = round(cfg.since * 1_000_000)
        keep = pc.greater(micros, lo) if cfg.since_exclusive else pc.greater_equal(micros, lo)
    if cfg.until is not None:
        hi = round(cfg.until * 1_000_000)
        upper = pc.less_equal(micros, hi) if cfg.until_inclusive else pc.less(micros, hi)
        keep = upper if keep is None else pc.and_(keep, upper)
    return keep


def _stored(chunk: Chunk, name: str) -> pa.Array | None:
    if not chunk.has(name):
        return None
    chunked = chunk.table.column(name)
    col = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
    if isinstance(col.type, pa.DictionaryType):
        col = col.dictionary_decode()
    return col


def _constant(value: Any, n: int, type_: pa.DataType) -> pa.Array:
    if value is None:
        return pa.nulls(n, type_)
    return pa.repeat(pa.scalar(value, type_), n)


def _text(chunk: Chunk, name: str, n: int) -> pa.Array:
    col = _stored(chunk, name)
    return col.cast(pa.string()) if col is not None else _constant(chunk.default(name), n, pa.string())


def _time(chunk: Chunk, name: str, n: int, type_: pa.DataType) -> pa.Array:
    col = _stored(chunk, name)
    if col is not None:
        return col.cast(type_)
    default = chunk.default(name)
    return (
        pa.nulls(n, type_)
        if default is None
        else pa.repeat(pa.scalar(int(default), pa.int64()), n).cast(type_)
    )


def headers_texts(chunk: Chunk, n: int) -> tuple[pa.Array, pa.Array]:
    """The distinct header texts of the chunk and, per row, the index of its text."""
    if not chunk.has("headers"):
        return pa.array([chunk.default("headers") or "{}"], pa.string()), pa.repeat(
            pa.scalar(0, pa.int32()), n
        )
    col = chunk.table.column("headers").combine_chunks()
    if not isinstance(col.type, pa.DictionaryType):
        col = pc.dictionary_encode(col.cast(pa.string()))
    texts = col.dictionary.cast(pa.string())
    return texts, pc.fill_null(col.indices, 0).cast(pa.int32())


def header_maps(texts: pa.Array, type_: pa.DataType) -> tuple[pa.Array, list[dict[str, str]]]:
    """Each distinct header text as a map value (and as a dict): one JSON parse per distinct text."""
    parsed = [{str(k): str(v) for k, v in json.loads(t or "{}").items()} for t in texts.to_pylist()]
    offsets, keys, items = [0], list[str](), list[str]()
    for d in parsed:
        keys.extend(d.keys())
        items.extend(d.values())
        offsets.append(len(keys))
    maps = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(items, pa.string()), type=type_
    )
    return maps, parsed


def chunk_batch(
    chunk: Chunk,
    item: ChunkItem,
    schema: pa.Schema,
    topic: str,
    cfg: ReadConfig,
    labels: Callable[[list[int], list[bool]], list[str]] | None = None,
) -> pa.RecordBatch | None:
    """The chunk's rows inside the read's window as a batch of ``schema`` (None when none are).

    ``labels(indexes, skipped)``: the consumer's state of each message (for ``state``), given
    its index in the segment and whether it is a redrive addressed to another consumer.
    """
    n = chunk.rows
    keep = window(_time(chunk, "created_at", n, pa.timestamp("us", tz="UTC")), cfg)
    if keep is not None and not pc.any(keep).as_py():
        return None
    index = pc.add(arange(n), item.first)
    head: tuple[pa.Array, pa.Array] | None = None
    maps: tuple[pa.Array, list[dict[str, str]]] | None = None
    arrays = []
    for f in schema:
        name, t = f.name, f.type
        if name == "id":
            ids = _stored(chunk, "id")
            assert ids is not None, "a chunk always stores ids"
            arrays.append(
                uuid_texts(ids) if pa.types.is_fixed_size_binary(ids.type) else ids.cast(pa.string())
            )
        elif name == "topic":
            arrays.append(pa.repeat(pa.scalar(topic, t), n))
        elif name == "partition":
            arrays.append(pa.repeat(pa.scalar(item.partition, t), n))
        elif name == "seq":
            arrays.append(pa.repeat(pa.scalar(item.seq, t), n))
        elif name == "index":
            arrays.append(index.cast(t))
        elif name == "offset":
            arrays.append(pc.add(index, item.base).cast(t))
        elif name in ("key", "content_type", "producer_id", "dedup_id"):
            arrays.append(_text(chunk, name, n).cast(t))
        elif name == "headers" or name == STATE_COLUMN:
            if head is None:
                head = headers_texts(chunk, n)
            if maps is None:
                maps = header_maps(
                    head[0],
                    schema.field("headers").type
                    if "headers" in schema.names
                    else pa.map_(pa.string(), pa.string()),
                )
            if name == "headers":
                arrays.append(maps[0].take(head[1]))
            else:
                arrays.append(pa.array(_labels(labels, maps[1], head[1], index, cfg), t))
        elif name == "payload":
            payload = _text(chunk, "payload", n)
            data = _stored(chunk, "data")
            if data is not None:
                payload = pc.if_else(pc.is_valid(data), pa.scalar(None, pa.string()), payload)
            arrays.append(payload.cast(t))
        elif name == "data":
            data = _stored(chunk, "data")
            arrays.append(data.cast(t) if data is not None else pa.nulls(n, t))
        elif name in ("created_at", "not_before"):
            arrays.append(_time(chunk, name, n, t))
        elif name == "priority":
            col = _stored(chunk, "priority")
            arrays.append(
                col.cast(t)
                if col is not None
                else pa.repeat(pa.scalar(int(chunk.default("priority") or 0), t), n)
            )
        else:
            raise ValueError(f"unknown column {name!r}")
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    return batch.filter(keep) if keep is not None else batch


def _labels(
    labels: Callable[[list[int], list[bool]], list[str]] | None,
    parsed: list[dict[str, str]],
    which: pa.Array,
    index: pa.Array,
    cfg: ReadConfig,
) -> list[str]:
    if labels is None:
        return ["pending"] * len(index)
    skipped = []
    for i in which.to_pylist():
        target = parsed[i].get(REDRIVE_FOR_HEADER)
        skipped.append(target is not None and target != cfg.consumer)
    return labels(index.to_pylist(), skipped)
