"""Every command's human output, end to end on the file backend, on a plain console (stdout piped,
as in scripts and CI) and on an 80-column terminal: it never crashes, names come out whole, piped
output is plain aligned columns, and destructive commands all refuse alike without --yes.

``test_golden_output.py`` pins what each table prints exactly, from fixed data.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner, Result

from bucketq.cli import app, output
from bucketq.cli.errors import EXIT_USAGE

runner = CliRunner()

TOPIC = "orders.dead-letters-of-the-europe-west-region"  # longer than an even share of 80 columns
GROUP = "billing-workers-europe-west-1"
DATE_TIME = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\b")
CONSOLES: dict[str, dict[str, Any]] = {
    "plain": {"width": 80, "force_terminal": False},
    "tty": {"width": 80, "force_terminal": True, "color_system": None},
}
# Commands whose human output is tested elsewhere (they start servers or other processes).
ELSEWHERE = {
    "bench": "tests/cli/test_cli.py, tests/cli/test_watch_and_progress.py",
    "demo": "tests/cli/test_demo.py",
    "dev": "tests/cli/test_dev_and_run.py",
    "run": "tests/cli/test_dev_and_run.py",
    "worker": "tests/cli/test_worker.py",
    "sidecar": "tests/sidecar (a server: its output is its log)",
    "operator": "tests/operator (a server: its output is its log)",
    "crds": "tests/operator/test_crds.py",
    "spark export": "tests/spark",
    "spark backfill": "tests/spark",
    "spark redrive": "tests/spark",
    "spark stats": "tests/spark",
}


@pytest.fixture(autouse=True)
def _no_bucketq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("BUCKETQ_"):
            monkeypatch.delenv(name)


def leaf_commands() -> set[str]:
    def walk(cmd: Any, path: list[str]) -> Iterator[str]:
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield " ".join(path)
            return
        for name, sub in subs.items():
            yield from walk(sub, [*path, name])

    return set(walk(typer.main.get_command(app), []))


class Session:
    """Runs commands on one file-backed bucket and records which ones it ran."""

    def __init__(self, path: Path) -> None:
        self.flags = ["--backend", "file", "--file-path", str(path)]
        self.ran: set[str] = set()

    def __call__(self, *args: str, input: str | None = None) -> Result:
        result = runner.invoke(app, [*self.flags, *args], input=input)
        words = [a for a in args if not a.startswith("-")]
        self.ran.add(" ".join(words[:2]) if words[0] in ("topic", "consumer", "dlq") else words[0])
        return result

    def ok(self, *args: str, input: str | None = None) -> str:
        result = self(*args, input=input)
        assert result.exit_code == 0, f"bucketq {' '.join(args)} -> {result.exit_code}: {result.output}"
        assert "Traceback" not in result.output
        return result.stdout


def check_table(text: str, mode: str, headers: list[str]) -> None:
    """Plain: the header line is exactly the upper-case headers, no box or colour; terminal: the
    lower-case headers over a rule. Either way every line is whole (the names checked by callers)."""
    lines = text.splitlines()
    if mode == "plain":
        assert "\x1b" not in text and "─" not in text and "│" not in text, text
        header = next(line for line in lines if line.startswith(headers[0].upper()))
        assert re.split(r"\s{2,}", header.strip()) == [h.upper() for h in headers], header
    else:
        i = next(i for i, line in enumerate(lines) if line.startswith(headers[0]))
        assert re.split(r"\s{2,}", lines[i].strip()) == headers, lines[i]
        assert set(lines[i + 1]) == {"─"}, lines[i + 1]


@pytest.mark.slow
# no writer runs across the deletion: its 7 s wait would prove nothing here
@pytest.mark.usefixtures("quick_topic_deletion")
@pytest.mark.parametrize("mode", ["plain", "tty"])
def test_every_command_prints_for_people(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "CONSOLE_OPTIONS", CONSOLES[mode])
    cli = Session(tmp_path / "bucket")

    created = cli.ok(
        "topic",
        "create",
        TOPIC,
        "-p",
        "2",
        "--retention",
        "1s",
        "--max-retention",
        "30d",
        "--subscription-timeout",
        "2s",
    )
    assert f"created topic {TOPIC}:" in created and "max retention 30d, subscription timeout 2s" in created
    assert "published message " in cli.ok("publish", TOPIC, '{"n": 0}', "-k", "k0")
    assert "published 3 messages" in cli.ok("publish", TOPIC, input='{"n": 1}\n{"n": 2}\n"three"\n')

    listed = cli.ok("topic", "list")
    check_table(listed, mode, ["topic", "partitions", "messages", "consumers", "retention"])
    assert TOPIC in listed

    described = cli.ok("topic", "describe", TOPIC)
    assert re.search(r"max retention\s+30d", described) and re.search(r"subscription timeout\s+2s", described)
    check_table(described, mode, ["partition", "segments", "messages"])

    # consume and peek print one date-time format for the same message
    peeked = cli.ok("peek", TOPIC, "-n", "4")
    consumed = cli.ok("consume", TOPIC, "-c", GROUP, "-n", "4")
    times_peeked = {line.split()[3]: DATE_TIME.search(line)[0] for line in peeked.splitlines()}  # type: ignore[index]
    times_consumed = {line.split()[3]: DATE_TIME.search(line)[0] for line in consumed.splitlines()}  # type: ignore[index]
    assert len(times_peeked) == 4 and times_peeked == times_consumed

    cli.ok("consume", TOPIC, "-c", "group-b", "-n", "1", "--dead-letter")
    for command, headers in (
        (("stats",), ["topic", "consumer", "messages", "backlog", "leased", "dead-lettered", "oldest"]),
        (
            ("consumer", "list"),
            ["topic", "consumer", "backlog", "leased", "dead-lettered", "members", "idle"],
        ),
        (("dlq", "list"), ["topic", "dead-letter topic", "dead letters", "not redriven"]),
    ):
        text = cli.ok(*command)
        check_table(text, mode, headers)
        assert TOPIC in text, text
    assert GROUP in cli.ok("stats")
    describe = cli.ok("consumer", "describe", TOPIC, GROUP)
    assert f"subscription {GROUP} of {TOPIC}" in describe
    check_table(
        describe,
        mode,
        ["partition", "messages", "backlog", "leased", "delayed", "acked", "dead-lettered", "oldest"],
    )

    shown = cli.ok("dlq", "show", TOPIC)
    check_table(shown, mode, ["position", "age", "from", "consumer", "deliveries", "reason", "payload"])
    (row,) = [line for line in shown.splitlines() if line.startswith("p0@") or line.startswith("p1@")]
    assert re.search(rf"\s(\d+(\.\d)?s|\d+ms)\s+{re.escape(TOPIC)}/p\d\s+group-b\s+1\s+nack\s", row), row
    assert "bucketq-dlq-at" not in shown  # no raw headers, no unix float
    assert re.match(
        rf"redrove 1 dead letter\(s\) of {re.escape(TOPIC)}\.dlq: 1 → {re.escape(TOPIC)}$",
        cli.ok("dlq", "redrive", TOPIC).strip(),
    )

    assert f"moved {GROUP} on {TOPIC} to p0@0, p1@0" in cli.ok(
        "consumer", "seek", TOPIC, GROUP, "--to", "earliest", "--yes"
    )
    time.sleep(2.5)  # past the subscription timeout: gc passes both groups (no member, no writes)
    collected = cli.ok("gc", TOPIC)
    assert collected.startswith(f"gc of {TOPIC}: ")
    assert f"past the subscription timeout): {TOPIC}/{GROUP}" in collected or f"{TOPIC}/group-b" in collected
    check_table(collected, mode, ["topic", "segments", "stored", "held for lagging"])

    assert f"deleted subscription group-b of {TOPIC}" in cli.ok(
        "consumer", "delete", TOPIC, "group-b", "--yes"
    )
    assert f"deleted topic {TOPIC}" in cli.ok("topic", "delete", TOPIC, "--yes")
    assert f"deleted topic {TOPIC}.dlq" in cli.ok("topic", "delete", f"{TOPIC}.dlq", "--yes")
    assert cli.ok("topic", "list").strip() == "no topics"

    checked = cli.ok("doctor", "--writers", "2", "--rounds", "1").splitlines()
    assert checked[0].startswith("put-if-absent strategy: "), checked
    assert [line.split()[0] for line in checked[1:-1]] == ["PASS"] * 6, checked
    assert checked[-1] == "the store does what bucketq assumes of it"

    assert leaf_commands() - cli.ran == set(ELSEWHERE), "a command's human output is untested"


@pytest.mark.parametrize(
    ("args", "action"),
    [
        (("topic", "delete", "jobs"), "delete topic 'jobs'"),
        (("consumer", "delete", "jobs", "g"), "delete subscription 'g' of 'jobs'"),
        (("consumer", "seek", "jobs", "g", "--to", "earliest"), "move subscription 'g' of 'jobs'"),
    ],
)
def test_destructive_commands_refuse_alike_without_yes_off_a_terminal(
    args: tuple[str, ...], action: str, tmp_path: Path
) -> None:
    cli = Session(tmp_path / "bucket")
    cli.ok("topic", "create", "jobs")
    cli.ok("consume", "jobs", "-c", "g", "-n", "1", "--wait", "0.1")
    result = cli(*args)  # CliRunner's stdin is not a terminal
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.strip() == f"error: refusing to {action} without --yes (stdin is not a terminal)"
    assert result.stdout == ""
    assert "g" in cli.ok("consumer", "list", "jobs")  # nothing changed


# -- the findings, one by one (each failed before the fix) ----------------------------------------


def test_gc_prints_a_report_for_people_on_a_topic_with_data(tmp_path: Path) -> None:
    cli = Session(tmp_path / "bucket")
    cli.ok("topic", "create", "jobs")
    cli.ok("publish", "jobs", "1", "2")
    text = cli.ok("gc")  # it used to crash: "unsupported format string passed to dict.__format__"
    assert text.startswith("gc of every topic: ")
    assert re.search(r"^jobs\s+1\s+\S+B\s+0$", text, re.MULTILINE), text


def test_names_are_whole_when_piped_at_80_columns(tmp_path: Path) -> None:
    cli = Session(tmp_path / "bucket")
    cli.ok("topic", "create", TOPIC, "--retention", "90m")
    cli.ok("consume", TOPIC, "-c", GROUP, "-n", "1", "--wait", "0.1")
    for args in (("topic", "list"), ("stats",), ("consumer", "list")):
        text = cli.ok(*args)
        assert TOPIC in text and "…" not in text, text
        rows = [line for line in text.splitlines() if TOPIC in line]
        assert rows and all(len(line.split()) > 2 for line in rows), text  # one line per row
    assert re.search(rf"^{re.escape(TOPIC)}\s+1\s+0\s+1\s+1h30m$", cli.ok("topic", "list"), re.MULTILINE)


def test_topic_describe_shows_the_limits_that_are_set(tmp_path: Path) -> None:
    cli = Session(tmp_path / "bucket")
    cli.ok("topic", "create", "jobs", "--max-retention", "30d", "--subscription-timeout", "3d")
    text = cli.ok("topic", "describe", "jobs")
    assert re.search(r"max retention\s+30d", text) and re.search(r"subscription timeout\s+3d", text), text


def test_dlq_show_is_a_table_of_reason_consumer_and_age(tmp_path: Path) -> None:
    cli = Session(tmp_path / "bucket")
    cli.ok("topic", "create", "jobs")
    cli.ok("publish", "jobs", '{"id": 7}')
    cli.ok("consume", "jobs", "-c", "billing", "-n", "1", "--dead-letter")
    text = cli.ok("dlq", "show", "jobs")
    header, row = text.splitlines()
    assert header.split() == ["POSITION", "AGE", "FROM", "CONSUMER", "DELIVERIES", "REASON", "PAYLOAD"]
    assert re.fullmatch(r'p0@0\s+\d+(\.\d)?(ms|s)\s+jobs/p0\s+billing\s+1\s+nack\s+\{"id": 7\}', row), row


def test_consume_and_peek_print_one_date_time_format(tmp_path: Path) -> None:
    cli = Session(tmp_path / "bucket")
    cli.ok("topic", "create", "jobs")
    cli.ok("publish", "jobs", "1")
    peeked = cli.ok("peek", "jobs").split()
    consumed = cli.ok("consume", "jobs", "-c", "g", "-n", "1").split()
    assert peeked[:4] == consumed[:4]  # position, date, time, id
    assert DATE_TIME.fullmatch(f"{consumed[1]} {consumed[2]}")
