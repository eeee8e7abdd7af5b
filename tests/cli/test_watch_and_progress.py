"""Something to look at while things run: ``bucketq stats --watch`` (in place on a terminal, a
timestamped table per refresh when piped, JSON lines with --json) and ``bench``'s progress bar
(on a terminal only; never in piped output or with --json)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bucketq.cli import app, output

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETQ_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env | {"COLUMNS": "100"}


def _interruptible() -> None:
    """In the child before exec: Ctrl-C (SIGINT) is delivered as Python's KeyboardInterrupt. A child
    inherits an ignored SIGINT (as a shell's background job does), and Python then never installs
    its handler: the watch would run on through the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _store(tmp_path: Path) -> list[str]:
    flags = ["--backend", "file", "--file-path", str(tmp_path / "bucket")]
    for args in (
        ["topic", "create", "orders"],
        ["publish", "orders", "1", "2", "3"],
        ["consume", "orders", "-c", "billing", "-n", "1"],
    ):
        assert runner.invoke(app, [*flags, *args]).exit_code == 0
    return flags


def _read_until(fd: int, proc: subprocess.Popen[Any], done: Any, timeout: float = 60) -> str:
    text = b""
    deadline = time.monotonic() + timeout
    while not done(text.decode(errors="replace")):
        assert time.monotonic() < deadline and proc.poll() is None, text.decode(errors="replace")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                text += os.read(fd, 65536)
            except OSError:
                break
    return text.decode(errors="replace")


@pytest.mark.slow
def test_stats_watch_piped_prints_a_timestamped_table_per_refresh_until_ctrl_c(tmp_path: Path) -> None:
    flags = _store(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", *flags, "stats", "--watch", "--interval", "200ms"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), preexec_fn=_interruptible,
    )  # fmt: skip
    assert proc.stdout is not None
    text = _read_until(proc.stdout.fileno(), proc, lambda t: t.count("TOPIC") >= 3)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # Ctrl-C ends a watch: not an error
    stamps = re.findall(r"^# (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)$", text, re.MULTILINE)
    assert len(stamps) >= 3
    assert re.search(r"^orders\s+billing\s+3\s+2\s+0\s+0\s+\S+$", text, re.MULTILINE), text
    assert "\x1b" not in text + rest.decode()


@pytest.mark.slow
def test_stats_watch_json_is_one_line_per_refresh(tmp_path: Path) -> None:
    flags = _store(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", *flags, "stats", "--watch", "--interval", "0.2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), preexec_fn=_interruptible,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert lines[1]["at"] > lines[0]["at"]
    assert [(s["consumer"], s["backlog"]) for s in lines[0]["stats"]] == [("billing", 2)]


@pytest.mark.slow
def test_stats_watch_on_a_terminal_redraws_in_place(tmp_path: Path) -> None:
    flags = _store(tmp_path)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", *flags, "stats", "--watch", "--interval", "0.2"],
        stdin=slave, stdout=slave, stderr=slave, env=_env() | {"TERM": "xterm"}, close_fds=True,
        preexec_fn=_interruptible,
    )  # fmt: skip
    os.close(slave)
    try:
        text = _read_until(master, proc, lambda t: t.count("billing") >= 3)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert "every 200ms (Ctrl-C to stop)" in text
    assert "\x1b[" in text and "─" in text  # drawn with the terminal's controls, a rule under the header
    assert "# 20" not in text  # not the piped form


def test_bench_progress_only_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def args(messages: int) -> list[str]:
        return [
            "bench",
            "-b",
            "memory",
            "-s",
            "publish",
            "-n",
            str(messages),
            "--producers",
            "1",
            "--partitions",
            "1",
        ]

    # where no bar is drawn a short run shows it as well as a long one (the bar's description is on
    # stderr from the scenario's start); the drawn bar needs a run long enough for its counts to move
    piped = runner.invoke(app, args(200))
    assert piped.exit_code == 0, piped.output
    assert "publish on memory" not in piped.stderr
    monkeypatch.setattr(output, "CONSOLE_OPTIONS", {"force_terminal": True, "width": 100})
    shown = runner.invoke(app, args(10000))
    assert shown.exit_code == 0, shown.output
    assert "publish on memory" in shown.stderr
    assert re.search(r"\d[\d,]* published, \d+ acked", shown.stderr)
    assert re.search(r"/10000", shown.stderr)  # the bar counts against the run's messages
    with_json = runner.invoke(app, [*args(200), "--json", str(tmp_path / "runs.json")])
    assert with_json.exit_code == 0 and "publish on memory" not in with_json.stderr
