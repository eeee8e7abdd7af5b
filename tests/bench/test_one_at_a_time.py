"""``bucketq bench -s one-at-a-time``: one message at a time, publisher in another process, bucketq
beside pawn-queue on one moto server; and through sidecars (pull, push).

Structure and sanity of the figures: every message arrives once, its latency is measured from its
own publish call, the requests are the server's (the publisher's included) and priced from them,
and every system of a run sees the same gaps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bucketq.bench.one_at_a_time import pawn_version, settings_fields
from bucketq.bench.params import BenchParams
from bucketq.bench.publisher_process import payload
from bucketq.cli import app
from bucketq.config import Settings
from tests.bench.test_bill_scenarios import assert_clean, bill

FAST = ["--one-messages", "6", "--one-max-gap-ms", "30", "--warmup", "0.3", "--timeout", "30"]


def _check_run(run: dict[str, Any], messages: int) -> None:
    assert run["scenario"] == "one-at-a-time"
    assert_clean(run)
    assert (run["messages"], run["published"], run["acked"]) == (messages, messages, messages)
    latencies = run["extra"]["latencies_ms"]
    assert len(latencies) == messages and all(0 < x < 30_000 for x in latencies), latencies
    # priced and counted at the server: the publisher's requests (another process) are in it
    assert run["counted_at"] == "server"
    assert run["usd"] == pytest.approx(bill(run["server_requests_by_op"]), rel=1e-12)
    assert run["requests_per_message"] == pytest.approx(run["server_requests"] / messages, abs=1e-4)
    assert run["usd_per_million_messages"] == pytest.approx(run["usd"] / messages * 1e6)
    assert run["extra"]["publish_call_p50_ms"] is not None


@pytest.mark.s3
@pytest.mark.slow
def test_bucketq_and_pawn_queue_one_at_a_time_on_one_moto(tmp_path: Path) -> None:
    assert pawn_version() == "0.1.3", "the dev extra installs the comparison"
    out = tmp_path / "one.json"
    result = CliRunner().invoke(
        app, ["bench", "-b", "moto", "-s", "one-at-a-time", *FAST, "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    ours, theirs = json.loads(out.read_text())
    for run in (ours, theirs):
        _check_run(run, 6)
    assert (ours["extra"]["system"], ours["via"], ours["profile"]) == ("bucketq", "library", "balanced")
    assert theirs["extra"]["system"] == "pawn-queue 0.1.3"
    # the same conversation: the gaps come from one seed
    assert ours["extra"]["mean_gap_ms"] == theirs["extra"]["mean_gap_ms"] > 0
    # the publisher's writes are in the server's count although no metered connection made them
    assert ours["server_calls_by_key"].get("PUT segment", 0) >= 1
    assert ours["calls_by_key"].get("PUT segment", 0) == 0


@pytest.mark.s3
@pytest.mark.slow
def test_one_at_a_time_through_sidecars_pull_and_push(tmp_path: Path) -> None:
    out = tmp_path / "one-sidecar.json"
    args = ["bench", "-b", "moto", "-s", "one-at-a-time", "--via", "sidecar", "--no-compare"]
    result = CliRunner().invoke(app, [*args, *FAST, "--json", str(out)])
    assert result.exit_code == 0, result.output
    pull, push = json.loads(out.read_text())
    for run in (pull, push):
        _check_run(run, 6)
        assert run["via"] == "sidecar"
        # no connection of the bench's own made a request: it was all the two sidecars
        assert run["s3_requests"] == 0 and run["server_requests"] > 0
    assert pull["extra"]["variant"].startswith("sidecar (pull)")
    assert push["extra"]["variant"].startswith("sidecar (push)")


def test_one_at_a_time_needs_a_store_another_process_can_reach() -> None:
    with pytest.raises(ValueError, match="another process"):
        BenchParams(backend="memory", scenarios=["one-at-a-time"])
    with pytest.raises(ValueError, match="one-at-a-time scenario alone"):
        BenchParams(backend="moto", scenarios=["one-at-a-time", "cost"], via="sidecar")
    BenchParams(backend="moto", scenarios=["one-at-a-time"], via="sidecar")
    BenchParams(backend="file", scenarios=["one-at-a-time"])
    with pytest.raises(ValueError, match="one_messages"):
        BenchParams(backend="file", scenarios=["one-at-a-time"], one_messages=0)


def test_one_at_a_time_via_sidecar_runs_alone() -> None:
    result = CliRunner().invoke(
        app, ["bench", "-b", "moto", "-s", "one-at-a-time", "-s", "idle", "--via", "sidecar"]
    )
    assert result.exit_code != 0
    assert "on its own" in result.output, result.output


def test_the_publisher_process_rebuilds_the_connection_settings() -> None:
    settings = Settings.from_dict(
        {
            "backend": "s3",
            "s3_bucket": "b",
            "s3_access_key_id": "key",
            "s3_secret_access_key": "secret",
            "profile": "latency",
            "producer": {"linger_ms": 7},
        }
    )
    again = Settings.from_dict(settings_fields(settings))
    assert again.model_dump() == settings.model_dump()
    assert again.s3_secret_access_key is not None
    assert again.s3_secret_access_key.get_secret_value() == "secret"


@pytest.mark.parametrize("size", [0, 50, 200, 1000])
def test_the_payload_carries_its_number_and_send_time(size: int) -> None:
    body = payload(7, 1234.5, size)
    assert (body["n"], body["sent"]) == (7, 1234.5)
    assert len(json.dumps(body, separators=(",", ":"))) == max(
        size, len(json.dumps(payload(7, 1234.5, 0), separators=(",", ":")))
    )
