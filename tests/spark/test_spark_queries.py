"""Query answers never depend on earlier queries of the same DataFrame.

Every predicate shape (ones a pushdown could take: partition, seq, created_at comparisons and IN;
ones it could not: OR, NOT, other columns, no filter at all) is run alone on a fresh DataFrame
and in sequences on one DataFrame, with the session's filter pushdown switched on and off, and
every count is compared with the answer computed from the messages the engine stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import pytest

from bucketq import Settings
from bucketq.core.segment import Record
from bucketq.spark import PUSHDOWN_CONF
from bucketq.spark.options import settings_options
from tests.spark.spark_helpers import publish_many, topic_records
from tests.support.servers import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.s3]

Row = tuple[int, int, Record]  # partition, seq, record
N = 900


@pytest.fixture(scope="module")
def topic(moto_server: S3Server) -> tuple[Settings, list[Row]]:
    settings = moto_server.settings(strategy="conditional_write")

    def make(i: int) -> dict[str, Any]:
        msg: dict[str, Any] = {"payload": {"n": i}, "created_at": 1_700_000_000 + i, "priority": i % 3}
        if i % 4:
            msg["key"] = f"k{i % 13}"
        return msg

    # several segments per partition (batches of 150)
    for start in range(0, N, 150):
        asyncio.run(
            publish_many(
                settings,
                "shapes",
                150,
                partitions=3,
                create=start == 0,
                make=lambda i, start=start: make(start + i),
            )
        )
    rows = [(p, seq, r) for p, seq, _, r in asyncio.run(topic_records(settings, "shapes"))]
    assert len(rows) == N and len({p for p, _, _ in rows}) == 3 and len({s for _, s, _ in rows}) > 2
    return settings, rows


def _at(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


CUT = 1_700_000_000 + N // 3
# (SQL predicate, the same predicate in Python); None: no filter
SHAPES: list[tuple[str | None, Callable[[Row], bool]]] = [
    (None, lambda r: True),
    ("partition = 1", lambda r: r[0] == 1),
    ("partition IN (0, 2)", lambda r: r[0] in (0, 2)),
    ("partition < 2", lambda r: r[0] < 2),
    ("partition >= 1", lambda r: r[0] >= 1),
    ("seq = 1", lambda r: r[1] == 1),
    ("seq > 0", lambda r: r[1] > 0),
    ("seq <= 1", lambda r: r[1] <= 1),
    (f"created_at >= '{_at(CUT)}'", lambda r: r[2].created_at >= CUT),
    (f"created_at < '{_at(CUT)}'", lambda r: r[2].created_at < CUT),
    ("partition = 1 AND seq >= 1", lambda r: r[0] == 1 and r[1] >= 1),
    ("partition = 1 OR seq = 1", lambda r: r[0] == 1 or r[1] == 1),
    ("NOT (partition = 1)", lambda r: r[0] != 1),
    ("key IS NULL", lambda r: r[2].key is None),
    ("priority = 0 AND partition = 2", lambda r: r[2].priority == 0 and r[0] == 2),
    ("seq = 0 OR key = 'k3'", lambda r: r[1] == 0 or r[2].key == "k3"),
]


def _count(df: Any, predicate: str | None) -> int:
    return int((df if predicate is None else df.where(predicate)).count())


@pytest.fixture
def session(spark: Any) -> Iterator[Any]:
    """The shared session with the filter pushdown conf on (restored afterwards): Spark then offers
    every query's filters to the source, the case where a pushed-down scan used to be reused. (With
    the conf off Spark plans one scan per DataFrame and never offers filters.)"""
    before = spark.conf.get(PUSHDOWN_CONF, None)
    spark.conf.set(PUSHDOWN_CONF, "true")
    yield spark
    if before is None:
        spark.conf.unset(PUSHDOWN_CONF)
    else:
        spark.conf.set(PUSHDOWN_CONF, before)


@pytest.mark.timeout(900)
def test_every_shape_alone_and_after_every_other_on_one_dataframe(
    session: Any, topic: tuple[Settings, list[Row]]
) -> None:
    settings, rows = topic
    expected = [sum(1 for r in rows if test(r)) for _, test in SHAPES]
    assert len(set(expected)) > 8  # the shapes really select different rows

    def load() -> Any:
        reader = (
            session.read.format("bucketq").options(**settings_options(settings)).option("topic", "shapes")
        )
        return reader.option("minPartitions", "1").load()  # one task per query: the answer is what counts

    # a narrowing shape first on a fresh DataFrame, then one with nothing to push
    assert [_count(load(), SHAPES[1][0]), _count(load(), SHAPES[11][0])] == [expected[1], expected[11]]
    # one DataFrame: every shape, each narrowing one (partition, seq, created_at) followed by one
    # with nothing to push (no filter, OR, NOT, other columns): the case where a reused
    # pushed-down scan answered with too few rows
    df = load()
    sequence = [0, 1, 0, 4, 11, 8, 12, 3, 15, 14, 13, 10, 0, 5, 11, 7, 12, 9, 13, 6, 15, 2, 0]
    assert set(sequence) == set(range(len(SHAPES)))
    for a, b in pairwise(sequence):
        # answered from the scan ``a`` planned, ``b`` would count other rows: a reuse fails here
        both = sum(1 for r in rows if SHAPES[a][1](r) and SHAPES[b][1](r))
        assert a == 0 or both != expected[b], (a, b)
    got = [(i, _count(df, SHAPES[i][0])) for i in sequence]
    assert got == [(i, expected[i]) for i in sequence]


def test_options_narrow_reads_and_agree_with_where(spark: Any, topic: tuple[Settings, list[Row]]) -> None:
    settings, rows = topic
    base = spark.read.format("bucketq").options(**settings_options(settings)).option("topic", "shapes")
    narrowed = base.option("partitions", "1").option("startSeq", "1").load()
    assert narrowed.count() == sum(1 for r in rows if r[0] == 1 and r[1] >= 1)
    assert narrowed.where("partition = 2").count() == 0
    assert narrowed.count() == base.load().where("partition = 1 AND seq >= 1").count()
    with pytest.raises(Exception, match="unknown option 'partition'"):
        base.option("partition", "0").load().count()
