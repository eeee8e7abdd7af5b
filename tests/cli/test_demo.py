"""``bucketq demo``: sidecar mode (real processes on moto server) and library mode on the file backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bucketq.cli import app
from bucketq.demo.sidecar import SidecarMetrics
from bucketq.sidecar.metrics import Metrics
from tests.support.processes import alive as _alive

ROOT = Path(__file__).resolve().parents[2]


def _rows(text: str) -> dict[str, str]:
    """``label -> value`` of the two-column summary table."""
    return {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in text.splitlines()
        if line.count("│") == 3
    }


@pytest.mark.s3
@pytest.mark.slow
def test_sidecar_demo_exits_0_with_books_and_metrics_and_stops_its_processes() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETQ_")}
    env.update(COLUMNS="100", PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH")))))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bucketq.cli",
            "demo",
            "--messages",
            "300",
            "--batch",
            "50",
            "--partitions",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for step in ("S3", "topic", "sidecar", "worker", "producer"):
        assert re.search(rf"✓ {step}\s", out), out
    assert "worker done: 300 processed, 0 failed" in out
    rows = _rows(out)
    assert rows["messages published"] == rows["consumed (acked by the worker)"] == "300"
    assert rows["duplicates"] == rows["lost"] == "0"
    assert float(rows["msgs/s"].replace(",", "")) > 0
    assert 0 < float(rows["S3 requests per message"]) < 5
    # the sidecar's own /metrics figures
    assert rows["published"] == rows["delivered"] == rows["acked"] == "300"
    assert rows["commit conflicts (412)"] == "0"
    by_op = {
        label: int(value.replace(",", "")) for label, value in rows.items() if label in ("GET", "PUT", "LIST")
    }
    assert by_op.get("PUT", 0) > 0
    assert sum(by_op.values()) <= int(rows["S3 requests"].replace(",", ""))
    # moto, the sidecar and the worker are all gone
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", out)]
    assert len(pids) == 3, out
    assert not [p for p in pids if _alive(p)]


def test_sidecar_demo_refuses_the_file_backend() -> None:
    result = CliRunner().invoke(app, ["demo", "--backend", "file"])
    assert result.exit_code == 2
    assert "--mode library" in result.output


def test_metrics_parsing_sums_the_sidecars_counters_over_labels() -> None:
    metrics = Metrics()
    metrics.prepare("c", ["a", "b"], push=False)
    metrics.acked.labels("a", "c").inc(3)
    metrics.acked.labels("b", "c").inc(4)
    metrics.leases_held.labels("c").set(9)
    for op, status in (("PUT", "200"), ("PUT", "412"), ("GET", "error"), ("GET", "200")):
        metrics.observe_s3(op, status, 0.01)
    m = SidecarMetrics.parse(metrics.render().decode())
    assert m["messages_acked"] == 7
    assert m["messages_delivered"] == 0
    assert m["leases_held"] == 0  # gauges are not counted
    assert m.s3_by_op == {"PUT": 2, "GET": 2}
    assert m.s3_requests == 4
    assert m.s3_failures == 1


def test_library_demo_on_file_backend_exits_0_with_summary() -> None:
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--mode",
            "library",
            "--backend",
            "file",
            "--messages",
            "200",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--partitions",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    for label in ("messages", "msgs/s", "S3 requests per message", "duplicates", "lost"):
        assert label in result.stdout
    rows = _rows(result.stdout)
    assert rows["messages"] == rows["acked"] == "200"
    assert rows["duplicates"] == rows["lost"] == "0"
