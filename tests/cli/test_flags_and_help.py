"""One flag vocabulary across commands, one duration and time syntax, and help text that reads
right (issue 26, findings 4 and 6): every command's help is rendered and checked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from bucketq.cli import app
from bucketq.cli.errors import CliError
from bucketq.cli.formats import TIME_HELP, parse_duration, parse_time

runner = CliRunner()
NOW = 1_795_650_000.0


def commands() -> Iterator[tuple[str, Any]]:
    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        yield " ".join(path), cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def help_of(path: str, columns: int = 200) -> str:
    result = runner.invoke(app, [*path.split(), "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


# -- durations and times ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("1h30m", 5400), ("1h30m15s", 5415), ("7d", 604_800),
     ("2w", 1_209_600), ("250ms", 0.25), ("1.5h", 5400), ("12H", 43_200), (" 3600 ", 3600)],
)  # fmt: skip
def test_one_duration_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "0", "0s", "-5s", "abc", "1x", "1h30", "h", "inf", "nan"])
def test_bad_durations_are_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(CliError, match=r"invalid duration .*such as 90s, 15m, 1h30m, 7d"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "unix"),
    [("15m", NOW - 900), ("1h30m", NOW - 5400), ("90", NOW - 90), ("1795600000", 1_795_600_000),
     ("1795600000.5", 1_795_600_000.5), ("2026-11-26T14:00:00+00:00", 1_795_701_600), ("2026-11-26T14:00:00Z", 1_795_701_600)],
)  # fmt: skip
def test_one_time_syntax(text: str, unix: float) -> None:
    assert parse_time(text, now=NOW) == pytest.approx(unix)


def test_a_bad_time_names_every_form() -> None:
    with pytest.raises(CliError, match=r"an age such as 15m or 1h30m, an ISO 8601 time, or Unix seconds"):
        parse_time("yesterday")


def test_commands_take_compound_durations(tmp_path: Path) -> None:
    flags = ["--backend", "file", "--file-path", str(tmp_path)]
    created = runner.invoke(
        app, [*flags, "topic", "create", "t", "--retention", "1h30m", "--max-retention", "2w"]
    )
    assert created.exit_code == 0, created.output
    assert "retention 1h30m" in created.stdout and "max retention 14d" in created.stdout
    assert runner.invoke(app, [*flags, "publish", "t", "1"]).exit_code == 0
    assert runner.invoke(app, [*flags, "peek", "t", "--since", "1h30m"]).stdout.count("\n") == 1
    assert (
        runner.invoke(app, [*flags, "consume", "t", "-c", "g", "-n", "1", "--wait", "1m30s"]).exit_code == 0
    )
    idle = runner.invoke(app, [*flags, "consume", "t", "-c", "g", "--wait", "300ms"])
    assert idle.exit_code == 0 and "no messages on t for g within 300ms" in idle.stderr
    seek = runner.invoke(app, [*flags, "consumer", "seek", "t", "g", "--to", "1h30m", "--yes"])
    assert seek.exit_code == 0 and "moved g on t to p0@0" in seek.stdout


# -- one vocabulary -----------------------------------------------------------------------------


def _options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if getattr(p, "opts", None) and any(o.startswith("-") for o in p.opts)]


def test_short_flags_mean_one_thing_everywhere() -> None:
    meaning = {"-c": {"--consumer"}, "-n": {"--max", "--messages"}, "-N": {"--namespace"}, "-y": {"--yes"}}
    for path, cmd in commands():
        for option in _options(cmd):
            for short, longs in meaning.items():
                if short in option.opts:
                    assert set(option.opts) & longs, f"bucketq {path}: {short} is {option.opts}"


def test_no_command_takes_its_topic_as_an_option() -> None:
    for path, cmd in commands():
        for option in _options(cmd):
            assert "--topic" not in option.opts, f"bucketq {path} takes --topic; topics are arguments"
            assert "--dlq" not in option.opts, f"bucketq {path} takes --dlq; topics are arguments"


def test_every_time_flag_takes_the_one_time_syntax() -> None:
    """``--since``/``--until`` take what ``peek --since`` takes everywhere (``spark export`` took
    ISO-8601 or Unix seconds only), and ``--consumer`` is a subscription whose messages a
    command reads or settles, never the bookkeeping subscription of a redrive."""
    seen = set()
    for path, cmd in commands():
        for option in _options(cmd):
            if {"--since", "--until"} & set(option.opts):
                seen.add(path)
                assert TIME_HELP in (option.help or ""), f"bucketq {path} {option.opts[0]}: {option.help}"
    assert {"peek", "spark export"} <= seen
    spark_redrive = dict(commands())["spark redrive"]
    assert not any("--consumer" in o.opts for o in _options(spark_redrive))


# -- help text ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(p for p, _ in commands()))
def test_help_reads_right(path: str) -> None:
    text = help_of(path)
    assert "<bool>" not in text, "a flag shown as taking a value"
    assert "``" not in text, "literal reST backticks"
    assert "(default" not in text, "a default not shown as [default: ...]"
    panel = re.search(r"Commands ─+╮\n(.*?)╰", text, re.DOTALL)
    if panel:  # each command's summary on its line: no docstring line break leaks into the list
        for row in panel[1].splitlines():
            assert re.match(r"│ \S", row), f"a summary continues on another line: {row!r}"


def test_choices_are_listed() -> None:
    sidecar = help_of("sidecar")
    assert re.search(r"--delivery\s+<pull\|push>", sidecar)
    assert re.search(r"--log-level\s+<debug\|info\|warning\|error\|critical>", sidecar)
    assert re.search(r"--config\s+<path>", sidecar) and not re.search(r"-c\s+<path>", sidecar)
    assert re.search(r"--consumer\s+-c", sidecar)
    assert re.search(r"--log-level\s+<debug\|info\|warning\|error\|critical>", help_of("operator"))
    assert re.search(r"--namespace\s+-N", help_of("operator"))


def test_the_sidecar_module_prints_the_help_of_bucketq_sidecar() -> None:
    """``python -m bucketq.sidecar`` is the same command: the same help, line for line (no
    ``<bool>`` on flags, no docstring line break leaking mid-sentence)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    shown = subprocess.run(
        [sys.executable, "-m", "bucketq.sidecar", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "<bool>" not in shown, "a flag shown as taking a value"

    def lines(text: str) -> list[str]:
        return [" ".join(line.split()) for line in text.splitlines() if line.strip() and "Usage:" not in line]

    assert lines(shown) == lines(help_of("sidecar", columns=80))
