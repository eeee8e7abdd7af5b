"""``bucketq bench``: tiny functional runs on the memory and file backends (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bucketq.bench.metered import key_kind
from bucketq.bench.tracker import Tracker, percentile
from bucketq.cli import app
from bucketq.cli.bench import parse_tuning
from bucketq.cli.errors import CliError

# S3 Standard list prices per 1,000 requests (DELETE free)
USD_PER_1000 = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}


def bill(by_op: dict[str, int]) -> float:
    return sum(n * USD_PER_1000[op] / 1000 for op, n in by_op.items())


REQUIRED = {
    "scenario",
    "backend",
    "messages",
    "producers",
    "consumers",
    "partitions",
    "msgs_per_s",
    "s3_requests",
    "s3_requests_per_message",
    "requests_by_op",
    "bytes_moved",
    "p50_ms",
    "p99_ms",
    "duplicates",
    "lost",
    "seconds",
    "via",
    "profile",
    "counted_at",
    "usd",
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "file"])
def test_bench_runs_every_scenario_without_loss(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--backend",
            backend,
            "--messages",
            "300",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--partitions",
            "2",
            "--latency-messages",
            "30",
            "--latency-rate",
            "200",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    runs = json.loads(out.read_text())
    assert [r["scenario"] for r in runs] == ["publish", "consume", "e2e", "latency"]
    for run in runs:
        assert run.keys() >= REQUIRED
        assert (run["backend"], run["via"], run["partitions"]) == (backend, "library", 2)
        assert run["duplicates"] == 0 and run["lost"] == 0 and run["completed"], run
        assert run["s3_requests"] == sum(run["requests_by_op"].values()) > 0
        assert run["s3_requests_per_message"] == pytest.approx(run["s3_requests"] / run["messages"], rel=1e-3)
        assert run["bytes_moved"] > 0 and run["msgs_per_s"] > 0
        assert run["p50_ms"] is not None and run["p99_ms"] >= run["p50_ms"]
        # no server log to read on these backends: the client's counts are billed, and say so
        assert (run["counted_at"], run["server_requests"], run["profile"]) == ("client", None, "balanced")
        assert run["usd"] == pytest.approx(bill(run["requests_by_op"]), rel=1e-12) and run["usd"] > 0
        assert run["usd_per_million_messages"] == pytest.approx(run["usd"] / run["messages"] * 1e6, rel=1e-12)
    by_name = {r["scenario"]: r for r in runs}
    assert by_name["publish"]["consumers"] == 0 and by_name["consume"]["producers"] == 0
    assert by_name["e2e"]["messages"] == by_name["e2e"]["acked"] == 300
    assert by_name["latency"]["messages"] == 30
    assert "PUT segment" in by_name["e2e"]["calls_by_key"]
    assert "e2e" in result.stdout and "req/msg" in result.stdout


def test_bench_single_scenario(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--scenario",
            "e2e",
            "--messages",
            "50",
            "--producers",
            "1",
            "--consumers",
            "1",
            "--partitions",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())
    assert (run["scenario"], run["messages"], run["duplicates"], run["lost"]) == ("e2e", 50, 0, 0)


def test_tracker_counts_duplicates_and_losses() -> None:
    t = Tracker(expected=3)
    for mid in ("a", "b", "c"):
        t.on_published(mid, t.publishing())
    t.on_acked("a", 0.0)
    t.on_acked("a", 0.0)
    t.on_acked("b", 0.0)
    assert (t.acked, t.duplicates, t.lost, t.done.is_set()) == (2, 1, 1, False)
    t.expect(2)
    assert t.done.is_set()


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("t/p0000/seg/0000000000000001.jsonl", "segment"),
        ("r/t/p0001/head.json", "head"),
        ("t/subs/c/p0000/log/0000000000000002.json", "delta"),
        ("t/subs/c/p0000/ckpt/0000000000000064.json", "checkpoint"),
        ("_registry/members/t/c/m.json", "member"),
        ("_registry/producers/x.json", "registry"),
        ("t/.topic", "topic"),
        ("t/.wake", "wake"),
        ("_probe/abc.probe", "probe"),
        ("t/p0000/seg/0000000000000001.jsonl.claim", "claim"),
        ("root/t/p0000/floor.json", "fence"),
        ("t/subs/c/p0000/trim.json", "fence"),
        ("t/txn/abc.json", "txn"),
        ("_spark/jobs/j.json", "spark"),
        ("subs/p0000/seg/", "segment"),  # a topic named like a path component
        ("t/subs/seg/p0000/log/", "delta"),  # a consumer named like one
        ("t/", "other"),
    ],
)
def test_key_kinds(key: str, kind: str) -> None:
    assert key_kind(key) == kind


def test_parse_tuning() -> None:
    assert parse_tuning(["producer.linger_ms=5", "strategy=conditional_write"]) == {
        "producer": {"linger_ms": 5},
        "strategy": "conditional_write",
    }
    with pytest.raises(CliError):
        parse_tuning(["linger"])
