"""Pure parts of the data source: options, filter pushdown, split planning, stream offsets, row mapping."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, Not
from pyspark.sql.types import MapType, StringType, StructField, StructType, TimestampType

from bucketq.errors import ConfigError, InvalidMessage
from bucketq.spark import filters
from bucketq.spark.options import ReadConfig, WriteConfig, offsets_json, parse_offsets
from bucketq.spark.planning import SegmentRef, group, target_size
from bucketq.spark.rows import RowMapper
from bucketq.spark.schema import arrow_schema, message_schema
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
    cfg = ReadConfig.from_options({**CONN, "topic": "t", "since": "2024-01-01T00:00:00Z", "until": "1704067260"})
    start = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    assert cfg.wants_time(start) and not cfg.wants_time(start - 1e-6)
    assert cfg.wants_time(start + 59.999999) and not cfg.wants_time(start + 60)


def test_pushdown_takes_what_it_applies_exactly() -> None:
    cfg = ReadConfig.from_options({**CONN, "topic": "t"})
    when = datetime(2024, 1, 1, tzinfo=UTC)
    kept = [Not(EqualTo(("partition",), 1)), EqualTo(("key",), "a")]
    pushed = [
        In(("partition",), (0, 1, 3)), LessThan(("partition",), 3), GreaterThanOrEqual(("seq",), 5),
        LessThan(("seq",), 9), GreaterThan(("created_at",), when),
    ]
    assert filters.push(cfg, kept + pushed) == kept
    assert cfg.partitions == frozenset({0, 1}) and (cfg.start_seq, cfg.end_seq) == (5, 9)
    assert cfg.since == when.timestamp() and cfg.since_exclusive
    assert not cfg.empty
    filters.push(cfg, [EqualTo(("seq",), 20)])
    assert cfg.empty


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
    schema = StructType([
        StructField("payload", StringType()), StructField("headers", MapType(StringType(), StringType())),
        StructField("created_at", TimestampType()), StructField("id", StringType()),
    ])
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
