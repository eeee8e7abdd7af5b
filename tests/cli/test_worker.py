"""``bucketq worker module:handler``: a real process on the file backend, with listen()'s semantics:
return acks, raise nacks (redelivered, counted), the lease outlives a handler slower than it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = """
import json, os, time

def _record(msg, what):
    with open(os.environ["LEDGER"], "a") as f:
        f.write(json.dumps({"payload": msg.payload, "deliveries": msg.deliveries, "what": what}) + "\\n")

async def flaky(msg):
    if msg.payload == "fail-once" and msg.deliveries < 2:
        _record(msg, "raised")
        raise ValueError("not yet")
    _record(msg, "done")

def slow(msg):  # sync: runs in a thread
    time.sleep(float(os.environ["SLEEP_S"]))
    _record(msg, "done")
"""


def bucketq(
    store: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETQ_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), base.get("PYTHONPATH"))))
    return subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", "--backend", "file", "--file-path", str(store), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base | (env or {}),
        cwd=cwd,
    )


def done(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}: {out}{err}"
    return out, err


def ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "handlers.py").write_text(textwrap.dedent(HANDLERS))
    return tmp_path


@pytest.mark.slow
def test_return_acks_and_raise_nacks_until_it_succeeds(app_dir: Path) -> None:
    store = app_dir / "store"
    done(bucketq(store, "topic", "create", "jobs", "-p", "2"))
    done(bucketq(store, "publish", "jobs", '"a"', '"fail-once"', '"c"'))
    env = {"LEDGER": str(app_dir / "ledger.jsonl")}
    _, err = done(
        bucketq(store, "worker", "handlers:flaky", "jobs", "-c", "w", "-n", "4", env=env, cwd=app_dir)
    )
    assert "failed (delivery 1): ValueError: not yet; nacked" in err
    assert "worker stopped: 3 acked, 1 failed" in err
    seen = ledger(app_dir / "ledger.jsonl")
    assert sorted((e["payload"], e["deliveries"], e["what"]) for e in seen) == [
        ("a", 1, "done"),
        ("c", 1, "done"),
        ("fail-once", 1, "raised"),
        ("fail-once", 2, "done"),
    ]
    out, _ = done(bucketq(store, "stats", "jobs", "--json"))
    (row,) = json.loads(out)
    assert (row["acked"], row["backlog"], row["in_flight"], row["dead_lettered"]) == (3, 0, 0, 0)


@pytest.mark.slow
def test_the_lease_is_extended_while_a_slow_sync_handler_runs(app_dir: Path) -> None:
    """A 3 s handler under a 1 s visibility timeout: delivered once, never to a second handler."""
    store = app_dir / "store"
    done(bucketq(store, "topic", "create", "jobs"))
    done(bucketq(store, "publish", "jobs", '"x"'))
    env = {
        "LEDGER": str(app_dir / "ledger.jsonl"),
        "SLEEP_S": "3",
        "BUCKETQ_CONSUMER__VISIBILITY_TIMEOUT_S": "1",
    }
    done(
        bucketq(
            store,
            "worker",
            "handlers:slow",
            "jobs",
            "-c",
            "w",
            "-n",
            "1",
            "--concurrency",
            "4",
            env=env,
            cwd=app_dir,
        )
    )
    assert ledger(app_dir / "ledger.jsonl") == [{"payload": "x", "deliveries": 1, "what": "done"}]
    out, _ = done(bucketq(store, "stats", "jobs", "--json"))
    assert json.loads(out)[0]["redelivered"] == 0


@pytest.mark.slow
def test_sigterm_lets_the_running_handler_finish(app_dir: Path) -> None:
    store = app_dir / "store"
    done(bucketq(store, "topic", "create", "jobs"))
    done(bucketq(store, "publish", "jobs", '"x"'))
    env = {"LEDGER": str(app_dir / "ledger.jsonl"), "SLEEP_S": "2"}
    proc = bucketq(store, "worker", "handlers:slow", "jobs", "-c", "w", env=env, cwd=app_dir)
    deadline = time.monotonic() + 30
    while proc.stderr is not None and "consuming jobs" not in proc.stderr.readline():
        assert time.monotonic() < deadline and proc.poll() is None
    time.sleep(1.0)  # the handler is running
    proc.send_signal(signal.SIGTERM)
    _, err = done(proc)
    assert "worker stopped: 1 acked, 0 failed" in err
    assert ledger(app_dir / "ledger.jsonl") == [{"payload": "x", "deliveries": 1, "what": "done"}]


@pytest.mark.e2e  # three bucketq processes
def test_a_bad_handler_is_a_usage_error(app_dir: Path) -> None:
    store = app_dir / "store"
    for spec, fragment in (
        ("handlers", "use module:function"),
        ("nope:f", "cannot import 'nope'"),
        ("handlers:missing", "has no 'missing'"),
    ):
        proc = bucketq(store, "worker", spec, "jobs", "-c", "w", cwd=app_dir)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and fragment in err, err
