"""``bucketq spark ...`` speaks the other commands' vocabulary (issue 26, finding 4): the topic is
an argument, ``--since``/``--until`` take the one time syntax, and ``spark redrive`` names a
topic or its dead-letter topic as ``bucketq dlq redrive`` does. A few dead letters are moved the
way ``dlq redrive`` moves them, in seconds, never by a Spark job (issue 24, finding 8). Every
check here runs before a Spark session would start: no JVM."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from bucketq import Bucketq, Settings
from bucketq.cli.app import app
from bucketq.cli.errors import EXIT_USAGE

FAST = {"consumer": {"poll_min_ms": 5, "poll_max_ms": 40}}


def _settings(path: Path) -> Settings:
    return Settings.from_dict(
        {"backend": "file", "file_path": str(path), "strategy": "conditional_write", **FAST}
    )


def _cli(path: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--backend", "file", "--file-path", str(path), "spark", *args])


async def _dead_letters(path: Path, count: int) -> set[str]:
    """``count`` orders dead-lettered by consumer billing (into orders.dlq)."""
    async with Bucketq(_settings(path)) as bq:
        await bq.create_topic("orders")
        await bq.create_topic("plain")
        for i in range(count):
            await bq.publish("orders", {"n": i})
        consumer = await bq.register_consumer("billing", "orders")
        got: list[Any] = []
        while len(got) < count:
            got += await consumer.poll(max_messages=count, wait=5)
        for msg in got:
            await msg.dead_letter("timeout")
        await consumer.close()
        return {m.id for m in got}


def test_a_bad_time_is_refused_before_spark_starts(tmp_path: Path) -> None:
    result = _cli(tmp_path, "export", "orders", "--to", str(tmp_path / "out"), "--since", "yesterday")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "invalid time 'yesterday'" in result.output and "1h30m" in result.output


def test_spark_redrive_takes_a_topic_or_its_dead_letter_topic(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    ids = asyncio.run(_dead_letters(bucket, 5))

    as_dlq = _cli(bucket, "redrive", "orders.dlq")  # a dead-letter topic alone: which source?
    assert as_dlq.exit_code == EXIT_USAGE and "name the source topic" in as_dlq.output
    elsewhere = _cli(bucket, "redrive", "orders", "--to", "plain")
    assert elsewhere.exit_code == EXIT_USAGE and "bucketq dlq redrive orders --to plain" in elsewhere.output
    none = _cli(bucket, "redrive", "plain")
    assert none.exit_code == EXIT_USAGE and "has no dead letters yet" in none.output

    moved = _cli(bucket, "redrive", "orders", "-q")
    assert moved.exit_code == 0, moved.output
    assert "redrove 5 dead letters from orders.dlq to orders without Spark" in moved.output
    assert "bucketq dlq redrive" in moved.output  # it says which path it took

    async def redriven() -> set[str]:
        async with Bucketq(_settings(bucket)) as bq:
            return {
                m.record.id
                for m in await bq.peek("orders", limit=100)
                if "bucketq-redrive-for" in m.record.headers
            }

    assert asyncio.run(redriven()) == ids
    again = _cli(bucket, "redrive", "orders.dlq", "--to", "orders", "-q")  # the other spelling
    assert again.exit_code == 0 and "redrove 0 dead letters" in again.output
