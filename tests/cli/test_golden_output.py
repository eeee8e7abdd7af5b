"""Golden human output of every table and line the CLI prints, at 80 columns, on a plain (piped)
console and on a terminal, from fixed data of the engine's own result types.

Regenerate after a deliberate change with ``BUCKETQ_UPDATE_GOLDENS=1 pytest tests/cli/test_golden_output.py``
and review the diff of ``tests/cli/golden/``. The same commands run end to end in
``test_human_output.py``; these pin exactly what they print.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from bucketq import TopicConfig
from bucketq.cli import consumers, dlq, gc, stats, topics
from bucketq.cli.peek import print_message_line
from bucketq.core.gc import GcReport, TopicStorage
from bucketq.core.peek import PeekedMessage
from bucketq.core.segment import Record
from bucketq.core.stats import PartitionStats, SubscriptionStats
from bucketq.core.topics import PartitionInfo, TopicInfo

GOLDEN = Path(__file__).parent / "golden"
NOW = 1_795_650_000.0  # 2026-11-25 23:40:00 UTC
WIDTH = 80
# Names longer than an 80-column table leaves them when cut evenly: they must come out whole.
LONG_TOPIC = "orders.dead-letters-of-the-europe-west-region"
LONG_CONSUMER = "billing-workers-europe-west-1"


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _console(mode: str) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    if mode == "tty":
        return Console(
            file=buffer, width=WIDTH, force_terminal=True, color_system=None, soft_wrap=True
        ), buffer
    return Console(file=buffer, width=WIDTH, force_terminal=False, soft_wrap=True), buffer


def _topic_info(name: str, messages: list[int], **config: object) -> TopicInfo:
    return TopicInfo(
        name=name,
        config=TopicConfig(partitions=len(messages), **config),
        created_at=NOW - 86_400 * 3,
        partitions=[PartitionInfo(p, n // 100 + (1 if n else 0), n) for p, n in enumerate(messages)],
        consumers=["billing", LONG_CONSUMER] if name == "orders" else [],
    )


def _partition(p: int, backlog: int, leased: int, dead: int, oldest: float | None) -> PartitionStats:
    return PartitionStats(p, 5000 + p, backlog, leased, p, 5000 - backlog, dead, 0, oldest)


def _subscription(
    topic: str, consumer: str, parts: list[PartitionStats], **extra: object
) -> SubscriptionStats:
    return SubscriptionStats(
        topic=topic,
        consumer=consumer,
        messages=sum(p.messages for p in parts),
        backlog=sum(p.backlog for p in parts),
        in_flight=sum(p.in_flight for p in parts),
        delayed=sum(p.delayed for p in parts),
        acked=sum(p.acked for p in parts),
        dead_lettered=sum(p.dead_lettered for p in parts),
        redelivered=0,
        oldest_age_s=max((p.oldest_age_s or 0 for p in parts), default=None),
        partitions=parts,
        **extra,  # type: ignore[arg-type]
    )


SUBSCRIPTIONS = [
    _subscription(
        "orders",
        "billing",
        [_partition(0, 1250, 595, 20, 4520.0), _partition(1, 0, 0, 0, None)],
        members=["billing-7f9c-0", "billing-7f9c-1"],
        last_activity=NOW - 3.2,
    ),
    _subscription(LONG_TOPIC, LONG_CONSUMER, [_partition(0, 12_345_678, 0, 0, 93_784.0)], last_activity=None),
]


def _dead_letter(offset: int, reason: str, payload: object) -> PeekedMessage:
    headers = {
        "bucketq-dlq-source-topic": "orders",
        "bucketq-dlq-partition": "1",
        "bucketq-dlq-position": "17:3",
        "bucketq-dlq-consumer": LONG_CONSUMER,
        "bucketq-dlq-reason": reason,
        "bucketq-dlq-deliveries": "5",
        "bucketq-dlq-at": f"{NOW - 754.5:.3f}",
    }
    record = Record(
        id=f"0196a2f0-8a1b-7c3d-9e4f-00000000000{offset}",
        headers=headers,
        payload=payload,
        created_at=NOW - 900,
    )
    return PeekedMessage("orders.dlq", 0, 0, offset, offset, record)


def _gc_report() -> GcReport:
    return GcReport(
        segments=4,
        deltas=12,
        members=2,
        fences_raised=4,
        expired_unconsumed=3,
        abandoned_subscriptions=["orders/group-a"],
        stored={
            "orders": TopicStorage(segments=9, bytes=1_234_567, held_for_lagging=2),
            LONG_TOPIC: TopicStorage(),
        },
    )


def _message_lines(console: Console) -> None:
    """A line of peek (with a subscription's state) and a line of consume (a redelivery)."""
    headers = {"trace": "abc"}
    print_message_line(
        console,
        0,
        12,
        NOW - 60,
        "0196a2f0-8a1b-7c3d-9e4f-0123456789ab",
        "customer-7",
        headers,
        ["pending", "deliveries=2"],
        '{"n": 1}',
    )
    print_message_line(
        console,
        1,
        7,
        NOW - 30,
        "0196a2f0-8a1b-7c3d-9e4f-0123456789ac",
        None,
        {},
        ["delivery 2"],
        "plain text",
    )


CASES: dict[str, Callable[[Console], None]] = {
    "topic-list": lambda c: topics.print_topic_list(
        [_topic_info("orders", [5000, 5001]), _topic_info(LONG_TOPIC, [12_345_678], retention_seconds=5400)],
        c,
    ),
    "topic-list-empty": lambda c: topics.print_topic_list([], c),
    "topic-describe": lambda c: topics.print_topic(
        _topic_info(
            "orders", [5000, 5001], max_retention_seconds=14 * 86_400, subscription_timeout_seconds=3 * 86_400
        ),
        c,
    ),
    "topic-describe-defaults": lambda c: topics.print_topic(_topic_info(LONG_TOPIC, [3]), c),
    "consumer-list": lambda c: consumers.print_subscription_list(
        [consumers._row(s, NOW) for s in SUBSCRIPTIONS], None, c
    ),
    "consumer-describe": lambda c: consumers.print_subscription(SUBSCRIPTIONS[0], NOW, c),
    "stats": lambda c: stats.print_stats(SUBSCRIPTIONS, None, c),
    "stats-empty": lambda c: stats.print_stats([], "orders", c),
    "dlq-list": lambda c: dlq.print_dlq_list(
        [
            {"topic": "orders", "dlq": "orders.dlq", "messages": 20, "waiting": 20},
            {"topic": LONG_TOPIC, "dlq": LONG_TOPIC + ".dlq", "messages": 1_000_000, "waiting": 0},
        ],
        c,
    ),
    "dlq-show": lambda c: dlq.print_dead_letters(
        [
            _dead_letter(0, "max_deliveries", {"id": 42, "amount": 9.5}),
            _dead_letter(1, "nack: bad order " * 4, "text"),
        ],
        NOW,
        c,
    ),
    "gc": lambda c: gc.print_gc(_gc_report(), None, c),
    "gc-nothing": lambda c: gc.print_gc(GcReport(), ["orders"], c),
    "message-lines": _message_lines,
}


@pytest.mark.parametrize("mode", ["plain", "tty"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, mode: str) -> None:
    console, buffer = _console(mode)
    CASES[case](console)
    text = buffer.getvalue()
    path = GOLDEN / f"{case}.{mode}.txt"
    if os.environ.get("BUCKETQ_UPDATE_GOLDENS"):
        path.write_text(text)
    assert path.exists(), f"no golden {path.name}: run with BUCKETQ_UPDATE_GOLDENS=1 and review it"
    assert text == path.read_text(), f"{case} ({mode}) differs from {path.name}:\n{text}"
    # whatever the golden says: names whole, one line per row, plain means plain
    for name in (LONG_TOPIC, LONG_CONSUMER):
        if name in text.replace("\n", ""):
            assert name in text, f"{name} is cut or wrapped in {case} ({mode})"
    if mode == "plain":
        assert "\x1b" not in text and "─" not in text and "│" not in text


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(min_value=30, max_value=140),
    names=st.lists(st.from_regex(r"[a-z][a-z0-9.-]{0,40}", fullmatch=True), min_size=1, max_size=4),
    texts=st.lists(
        st.lists(st.from_regex(r"[a-z0-9_{}\":,]{1,18}", fullmatch=True), max_size=12), min_size=1, max_size=4
    ),
)
def test_a_terminal_table_drops_nothing(width: int, names: list[str], texts: list[list[str]]) -> None:
    """Whatever the width: every name whole on its row's first line, every word of free text whole
    and in order (rich alone could wrap a cell at one width and draw it narrower, dropping text)."""
    from bucketq.cli.output import Column, print_table

    rows = [
        (name, f"{i:,}", " ".join(words))
        for i, (name, words) in enumerate(zip(names, texts * 4, strict=False))
    ]
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system=None, soft_wrap=True)
    print_table((Column("name"), Column("n", "number"), Column("text", "text")), rows, console)
    text = buffer.getvalue()
    body = text.splitlines()[2:]  # under the header and its rule
    for name, _, words in rows:
        start = next(i for i, line in enumerate(body) if line.split()[:1] == [name])
        found = iter(" ".join(body[start:]).split())
        assert all(any(w == f for f in found) for w in words.split()), (words, text)
