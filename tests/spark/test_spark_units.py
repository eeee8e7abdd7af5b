"""Pure parts of the data source: options, filter pushdown, split planning, stream offsets, row mapping."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import Future
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import MapType, StringType, StructField, StructType, TimestampType

from bucketq import Bucketq, Settings
from bucketq.core.chunks import chunk_records, decode_chunk, encode_chunk
from bucketq.core.producer import partition_for_key
from bucketq.core.segment import Record
from bucketq.errors import ConfigError, InvalidMessage, MessageTooLarge
from bucketq.spark import redrive
from bucketq.spark.encoding import ChunkEncoder
from bucketq.spark.options import ReadConfig, WriteConfig, offsets_json, parse_offsets
from bucketq.spark.planning import Item, SegmentItem, group, list_segments, target_size
from bucketq.spark.rows import RowMapper
from bucketq.spark.schema import arrow_schema, message_schema
from bucketq.spark.stream import _cap
from bucketq.spark.writing import ChunkWriter
from bucketq.storage import MemoryStore

pytestmark = [pytest.mark.spark]

CONN = {"bucket": "b", "endpoint": "http://127.0.0.1:1", "accessKeyId": "k", "secretAccessKey": "s"}


def test_options_resolve_settings_and_reject_bad_values() -> None:
    cfg = ReadConfig.from_options({**CONN, "topic": "orders", "Partitions": "0,2", "startSeq": "3"})
    assert cfg.partitions == frozenset({0, 2}) and cfg.start_seq == 3
    assert cfg.settings["s3_bucket"] == "b" and cfg.settings["s3_secret_access_key"] == "s"
    with pytest.raises(ConfigError, match="topic"):
        ReadConfig.from_options(CONN)
    with pytest.raises(ConfigError, match="startSeq"):
        ReadConfig.from_options({**CONN, "topic": "t", "startSeq": "x"})
    with pytest.raises(ConfigError, match="payloadFormat"):
        WriteConfig.from_options({**CONN, "topic": "t", "payloadFormat": "xml"})


def test_time_window_is_exact_to_the_microsecond() -> None:
    cfg = ReadConfig.from_options(
        {**CONN, "topic": "t", "since": "2024-01-01T00:00:00Z", "until": "1704067260"}
    )
    start = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    assert cfg.wants_time(start) and not cfg.wants_time(start - 1e-6)
    assert cfg.wants_time(start + 59.999999) and not cfg.wants_time(start + 60)


def test_unknown_options_fail_with_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown option 'partition' \(did you mean 'partitions'\?\) for a bucketq read; valid options: .*partitions",
    ):
        ReadConfig.from_options({**CONN, "topic": "t", "partition": "0"})
    with pytest.raises(ConfigError, match=r"'jobid2'.* for a bucketq write; valid options: .*jobId"):
        WriteConfig.from_options({**CONN, "topic": "t", "jobid2": "x"})
    with pytest.raises(ConfigError, match=r"'consumer' for a bucketq stream"):
        ReadConfig.from_options({**CONN, "topic": "t", "consumer": "c"}, stream=True)
    with pytest.raises(ConfigError, match="batchMessages"):  # a write option on a read
        ReadConfig.from_options({**CONN, "topic": "t", "batchMessages": "5"})
    # case does not matter, as everywhere in Spark
    assert ReadConfig.from_options({**CONN, "TOPIC": "t", "PARTITIONS": "1"}).partitions == frozenset({1})
    with pytest.raises(ConfigError, match="pushdown=true is not supported"):
        ReadConfig.from_options({**CONN, "topic": "t", "pushdown": "true"})
    assert ReadConfig.from_options({**CONN, "topic": "t", "pushdown": "false"}).topic == "t"
    with pytest.raises(ConfigError, match="compression"):
        WriteConfig.from_options({**CONN, "topic": "t", "compression": "lz4"})
    with pytest.raises(ConfigError, match="jobId"):
        WriteConfig.from_options({**CONN, "topic": "t", "jobId": "a.b"})  # a dot would break txn ids


def test_read_config_is_immutable() -> None:
    cfg = ReadConfig.from_options({**CONN, "topic": "t"})
    with pytest.raises(FrozenInstanceError):
        cfg.partitions = frozenset({1})  # type: ignore[misc]


def _encoder(schema: StructType, **options: str) -> ChunkEncoder:
    cfg = WriteConfig.from_options({**CONN, "topic": "t", **options})
    cfg.partitions, cfg.producer_id, cfg.run = 4, "pid", "run"
    return ChunkEncoder(schema, cfg, 0)


def _records(encoder: ChunkEncoder, batch: pa.RecordBatch) -> list[tuple[int, Record]]:
    """(partition, record) of every message, read back through the chunk format."""
    out = []
    for partition, table in encoder.encode(batch):
        chunk = encode_chunk(table, defaults=encoder.defaults())
        out += [(partition, r) for r in chunk_records(decode_chunk(chunk))]
    return out


def test_payload_texts_are_kept_exactly_and_validated_in_bulk() -> None:
    schema = StructType([StructField("payload", StringType()), StructField("key", StringType())])
    encoder = _encoder(schema)
    texts = ['{"n": 1}', "[1, 2.5, null]", '"s\\u00e9"', "7", None, '{"nested": {"a": [true]}}', " null "]
    keys = ["k-1", None, 'q"uote', "k-1", None, "é", None]
    batch = pa.RecordBatch.from_pylist(
        [{"payload": t, "key": k} for t, k in zip(texts, keys, strict=True)], schema=arrow_schema(schema)
    )
    tables = list(encoder.encode(batch))
    stored = sorted(x for _, table in tables for x in table.column("payload").to_pylist() if x is not None)
    # exactly the given text (spaces and escapes kept); SQL NULL and JSON null are both null
    assert stored == sorted(t for t in texts if t is not None and t.strip() != "null")
    records = [(p, r) for p, r in _records(encoder, batch)]
    for partition, record in records:
        if record.key is not None:
            assert partition == partition_for_key(record.key, 4)
    want = sorted(
        (k or "", json.dumps(json.loads(t) if t else None)) for t, k in zip(texts, keys, strict=True)
    )
    assert sorted((r.key or "", json.dumps(r.payload)) for _, r in records) == want
    ids = [r.id for _, r in records]
    assert len(set(ids)) == len(ids) and all(uuid.UUID(i).version == 7 for i in ids)
    assert all(r.producer_id == "pid" and r.content_type == "application/json" for _, r in records)
    # what is not exactly one JSON value fails the task as the engine's encoder would
    for bad in ['1}{"p":2', '1,"q":2', "NaN", '{"a":1,}', "", "[1", "1 2", '{\n"a": NaN}']:
        broken = pa.RecordBatch.from_pylist(
            [{"payload": "1", "key": None}, {"payload": bad, "key": None}], schema=arrow_schema(schema)
        )
        with pytest.raises(InvalidMessage, match="not JSON"):
            list(encoder.encode(broken))
    # a batch of objects is checked without building columns: two objects in one text still fail
    for bad in ['{"a":1}{"b":2}', '{"a":1} {"b":2}', '{"a":1},{"b":2}', '{"a": [1,}', '{"a":NaN}']:
        objects = pa.RecordBatch.from_pylist(
            [{"payload": '{"ok":1}', "key": None}, {"payload": bad, "key": None}], schema=arrow_schema(schema)
        )
        with pytest.raises(InvalidMessage, match="not JSON"):
            list(encoder.encode(objects))
    # line breaks inside a payload are valid JSON, kept as they are
    multi = pa.RecordBatch.from_pylist(
        [{"payload": '{\n "a": 1\n}', "key": None}], schema=arrow_schema(schema)
    )
    ((_, table),) = list(encoder.encode(multi))
    assert table.column("payload").to_pylist() == ['{\n "a": 1\n}']
    strings = _encoder(StructType([StructField("payload", StringType())]), payloadFormat="string")
    plain = pa.RecordBatch.from_pylist(
        [{"payload": 'a "q"'}, {"payload": None}], schema=pa.schema([("payload", pa.string())])
    )
    assert [r.payload for _, r in _records(strings, plain)] == ['a "q"', None]


def test_unkeyed_rows_spread_evenly_whatever_the_batches() -> None:
    """Finding 7: 10,023 unkeyed rows into 2 partitions went 9,998 / 5 (a whole batch to one)."""
    schema = StructType([StructField("payload", StringType())])
    counts: dict[int, int] = {}
    for task in range(2):
        encoder = _encoder(schema)
        encoder.spread = task % 4
        for size in (10_000, 7, 1, 3, 12):
            batch = pa.RecordBatch.from_pylist([{"payload": "1"}] * size, schema=arrow_schema(schema))
            for partition, table in encoder.encode(batch):
                counts[partition] = counts.get(partition, 0) + table.num_rows
    assert sum(counts.values()) == 2 * 10_023
    assert max(counts.values()) - min(counts.values()) <= 2  # at most one row per task


def test_headers_ids_and_times_become_chunk_columns() -> None:
    schema = StructType(
        [
            StructField("payload", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("id", StringType()),
            StructField("created_at", TimestampType()),
        ]
    )
    when = datetime(2024, 1, 1, tzinfo=UTC)
    given = str(uuid.uuid4())
    batch = pa.RecordBatch.from_pylist(
        [
            {"payload": "1", "headers": [("h", 'v"1')], "id": given, "created_at": when},
            {"payload": "2", "headers": [], "id": None, "created_at": None},
        ],
        schema=arrow_schema(schema),
    )
    records = [r for _, r in _records(_encoder(schema), batch)]
    by_payload = {r.payload: r for r in records}
    assert dict(by_payload[1].headers) == {"h": 'v"1'} and dict(by_payload[2].headers) == {}
    assert by_payload[1].id == given and uuid.UUID(by_payload[2].id).version == 7
    assert by_payload[1].created_at == when.timestamp() and by_payload[2].created_at > when.timestamp()
    too_big = pa.RecordBatch.from_pylist(
        [{"payload": '"' + "x" * 300_000 + '"', "headers": [], "id": None, "created_at": None}],
        schema=arrow_schema(schema),
    )
    with pytest.raises(MessageTooLarge):
        list(_encoder(schema).encode(too_big))


def test_chunks_respect_message_and_byte_limits() -> None:
    cfg = WriteConfig.from_options({**CONN, "topic": "t", "batchMessages": "7", "batchBytes": "2000"})
    cfg.partitions, cfg.run = 1, "run"

    class Store:
        def __init__(self) -> None:
            self.objects: dict[str, bytes] = {}

        def put(self, key: str, body: bytes) -> Future[str]:
            self.objects[key] = body
            done: Future[str] = Future()
            done.set_result(f"etag-{len(self.objects)}")
            return done

        def wait(self) -> None:
            pass

    store = Store()
    writer = ChunkWriter(cfg, "job/run/t00000-a0", store)
    encoder = ChunkEncoder(StructType([StructField("payload", StringType())]), cfg, 0)
    payloads = [f'"{"x" * (i % 400)}"' for i in range(100)]
    batch = pa.RecordBatch.from_pylist(
        [{"payload": p} for p in payloads], schema=pa.schema([("payload", pa.string())])
    )
    for partition, table in encoder.encode(batch):
        writer.add(partition, table)
    refs = writer.finish()[0]
    assert sum(r.count for r in refs) == 100
    got = []
    for ref in refs:
        (key,) = [k for k in store.objects if k.endswith(ref.name)]
        chunk = decode_chunk(store.objects[key])
        assert chunk.rows == ref.count <= 7 and len(store.objects[key]) == ref.bytes
        assert ref.count == 1 or chunk.table.nbytes <= 2000 * 4
        got += chunk.table.column("payload").to_pylist()
    assert got == payloads  # in order, each once


def test_segments_are_grouped_by_size() -> None:
    segs: list[Item] = [SegmentItem(p, s, 10) for p in range(2) for s in range(5)]
    groups = group(segs, 25)
    assert [len(g) for g in groups] == [2, 2, 2, 2, 2]
    assert [s for g in groups for s in g] == segs
    cfg = ReadConfig.from_options({**CONN, "topic": "t", "minPartitions": "4"})
    assert target_size(100, cfg) == 25


async def test_planning_lists_only_segment_names_bucketq_writes() -> None:
    """I8: a foreign ``1.jsonl`` in ``seg/`` is no segment 1 (it sorts after the real ones and
    was planned as seq 1 again: its rows read twice), and ``README.txt`` after them ends nothing."""
    async with Bucketq(Settings.from_dict({"backend": "memory"}), store=MemoryStore()) as bq:
        await bq.create_topic("t", partitions=1)
        for i in range(3):
            await bq.publish("t", i)
        prefix = bq.keys.segments_prefix("t", 0)
        for name in ("1.jsonl", ".keep", "README.txt", "0000000000000001.jsonl.bak"):
            await bq.storage.overwrite(prefix + name, b"someone else's\n")
        refs = await list_segments(bq.storage, bq.keys, "t", 0, 0, None)
        assert [r.seq for r in refs] == [0, 1, 2]
        assert [r.seq for r in await list_segments(bq.storage, bq.keys, "t", 0, 1, 3)] == [1, 2]


async def test_redrive_cursor_writes_carry_the_dead_letter_topics_incarnation(tmp_path: Path) -> None:
    """I6 (format 4): the Spark redrive's claims and acks on the dead-letter topic's cursor are
    deltas stamped with the topic's incarnation, like every other cursor write, so a log left by
    another incarnation of the topic never takes them (they were unstamped)."""
    settings = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    async with Bucketq(settings) as bq:
        await bq.create_topic("orders.dlq", partitions=1)
        for i in range(2):
            await bq.publish("orders.dlq", i)
        incarnation = (await bq.catalog.marker("orders.dlq")).incarnation
        claims = await redrive.claim(
            settings, "orders.dlq", "redrive", {0: [(0, 0), (1, 0)]}, lease_s=60, member="m"
        )
        assert claims.count == 2
        assert await redrive.ack(settings, "orders.dlq", "redrive", claims) == (2, 0)
        prefix = bq.keys.deltas_prefix("orders.dlq", "redrive", 0)
        deltas = [json.loads((await bq.storage.get(i.key)).data) async for i in bq.storage.list(prefix)]  # type: ignore[union-attr]
        assert len(deltas) >= 2 and {d.get("inc") for d in deltas} == {incarnation}


def test_stream_offsets_and_caps() -> None:
    assert parse_offsets("t", offsets_json("t", {1: 7, 0: 3})) == {0: 3, 1: 7}
    with pytest.raises(ConfigError):
        parse_offsets("t", {"other": {"0": 1}})
    assert _cap({0: 0, 1: 5}, {0: 4, 1: 6, 2: 2}, 4) == {0: 2, 1: 6, 2: 1}
    assert _cap({0: 0}, {0: 2}, 10) == {0: 2}


def test_arrow_schema_matches_spark() -> None:
    schema = arrow_schema(message_schema(with_state=True))
    assert schema.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert not schema.field("id").nullable and schema.names[-1] == "state"


def test_row_mapping() -> None:
    cfg = WriteConfig.from_options({**CONN, "topic": "t", "keepIds": "false"})
    schema = StructType(
        [
            StructField("payload", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("created_at", TimestampType()),
            StructField("id", StringType()),
        ]
    )
    when = datetime(2024, 1, 1, tzinfo=UTC)
    batch = pa.RecordBatch.from_pylist(
        [{"payload": '{"a": [1, 2]}', "headers": [("h", "v")], "created_at": when, "id": "x"}],
        schema=arrow_schema(schema),
    )
    (record,) = RowMapper(schema, cfg).records(batch)
    assert record.payload == {"a": [1, 2]} and dict(record.headers) == {"h": "v"}
    assert record.created_at == when.timestamp() and record.id != "x"
    with pytest.raises(InvalidMessage, match="not message fields"):
        RowMapper(StructType([StructField("payload", StringType()), StructField("x", StringType())]), cfg)


def test_spark_finds_the_source_without_register() -> None:
    """Spark's start-up lookup imports top-level ``pyspark_*`` modules and takes their ``DefaultSource``."""
    from importlib import import_module
    from pkgutil import iter_modules

    from pyspark.sql.datasource import DataSource

    names = [m.name for m in iter_modules() if m.name.startswith("pyspark_")]
    assert "pyspark_bucketq" in names
    source = import_module("pyspark_bucketq").DefaultSource
    assert issubclass(source, DataSource) and source.name() == "bucketq"
