"""Pure parts of the data source: options, filter pushdown, split planning, stream offsets, row mapping."""

from __future__ import annotations

import json
import uuid
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyspark.sql.types import MapType, StringType, StructField, StructType, TimestampType

from bucketq.core.producer import partition_for_key
from bucketq.core.segment import Record, decode_segment
from bucketq.errors import ConfigError, InvalidMessage
from bucketq.spark.options import ReadConfig, WriteConfig, offsets_json, parse_offsets
from bucketq.spark.planning import SegmentRef, group, target_size
from bucketq.spark.rows import RowMapper
from bucketq.spark.schema import arrow_schema, message_schema
from bucketq.spark.staging import ChunkWriter, LineEncoder
from bucketq.spark.stream import _cap

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


def test_fast_lines_decode_like_the_engine_and_reject_what_it_rejects() -> None:
    cfg = WriteConfig.from_options({**CONN, "topic": "t"})
    cfg.partitions, cfg.producer_id, cfg.run = 4, "pid", "run"
    schema = StructType([StructField("payload", StringType()), StructField("key", StringType())])
    encoder = LineEncoder(schema, cfg, 0)
    assert encoder.fast
    texts = ['{"n": 1}', "[1, 2.5, null]", '"s\\u00e9"', "7", None, '{"nested": {"a": [true]}}']
    keys = ["k-1", None, 'q"uote', "k-1", None, "é"]
    batch = pa.RecordBatch.from_pylist(
        [{"payload": t, "key": k} for t, k in zip(texts, keys, strict=True)], schema=arrow_schema(schema)
    )
    records = []
    for partition, lines in encoder.encode(batch):  # mixed payload types: message by message
        for line in _lines(lines):
            record = Record.from_json(json.loads(line))
            records.append(record)
            if record.key is not None:
                assert partition == partition_for_key(record.key, 4)
    by_key = sorted((r.key or "", json.dumps(r.payload)) for r in records)
    want = sorted(
        (
            (k or "", json.dumps(json.loads(t) if t is not None else None))
            for t, k in zip(texts, keys, strict=True)
        )
    )
    assert by_key == want
    ids = [r.id for r in records]
    assert len(set(ids)) == len(ids) and all(uuid.UUID(i).version == 7 for i in ids)
    assert all(r.producer_id == "pid" and r.content_type == "application/json" for r in records)
    uniform = pa.RecordBatch.from_pylist(
        [{"payload": f'{{"n": {i}}}', "key": f"k{i}"} for i in range(50)], schema=arrow_schema(schema)
    )
    out = list(encoder.encode(uniform))
    assert all(isinstance(lines, pa.Array) for _, lines in out)  # the bulk path
    got = sorted(
        Record.from_json(json.loads(line)).payload["n"] for _, lines in out for line in _lines(lines)
    )
    assert got == list(range(50))
    # what is not exactly one JSON value fails the task as the engine's encoder would
    for bad in ['1}{"p":2', '1,"q":2', "NaN", '{"a":1,}', "", "[1", "1 2", '{\n"a": NaN}']:
        broken = pa.RecordBatch.from_pylist(
            [{"payload": "1", "key": None}, {"payload": bad, "key": None}], schema=arrow_schema(schema)
        )
        with pytest.raises(InvalidMessage, match="not JSON"):
            list(encoder.encode(broken))
    # line breaks inside a payload are valid JSON: stored re-encoded on one line
    multi = pa.RecordBatch.from_pylist(
        [{"payload": '{\n "a": 1\n}', "key": None}], schema=arrow_schema(schema)
    )
    ((_, lines),) = list(encoder.encode(multi))
    assert [Record.from_json(json.loads(line)).payload for line in _lines(lines)] == [{"a": 1}]


def _lines(lines: pa.Array | list[bytes]) -> list[str | bytes]:
    return list(lines.to_pylist()) if isinstance(lines, pa.Array) else list(lines)


def test_chunks_respect_message_and_byte_limits() -> None:
    cfg = WriteConfig.from_options({**CONN, "topic": "t", "batchMessages": "7", "batchBytes": "2000"})
    cfg.partitions, cfg.run = 1, "run"

    class Store:
        def __init__(self) -> None:
            self.objects: dict[str, bytes] = {}

        def put(self, key: str, body: bytes) -> None:
            self.objects[key] = body

        def wait(self) -> None:
            pass

    store = Store()
    writer = ChunkWriter(cfg, "root", store)  # type: ignore[arg-type]
    lines = pa.array([f'{{"id":"{i}","payload":"{"x" * (i % 400)}"}}\n' for i in range(100)])
    writer.add(0, lines)
    writer.finish()
    chunks = writer.chunks[0]
    assert sum(c.count for c in chunks) == 100
    numbers = []
    for chunk in chunks:
        segment = decode_segment(store.objects[chunk.key])
        assert segment.header.count == chunk.count <= 7
        assert len(store.objects[chunk.key]) == chunk.bytes
        body = sum(len(json.dumps(r.to_json())) for r in segment.records)
        assert chunk.count == 1 or body <= 2000 * 2
        numbers += [int(r.id) for r in segment.records]
    assert numbers == list(range(100))  # in order, each once


def test_segments_are_grouped_by_size() -> None:
    segs = [SegmentRef(p, s, 10) for p in range(2) for s in range(5)]
    groups = group(segs, 25)
    assert [len(g) for g in groups] == [2, 2, 2, 2, 2]
    assert [s for g in groups for s in g] == segs
    cfg = ReadConfig.from_options({**CONN, "topic": "t", "minPartitions": "4"})
    assert target_size(100, cfg) == 25


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
