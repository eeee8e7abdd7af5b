"""The billing scenarios (idle, cost, awaited) on a real moto server: structure and sanity of the figures.

Counts are checked both ways: the server's (moto's access log) against the client's (the metered
connections) within a tolerance for requests in flight at a window's edge, and every dollar figure
against counts times the published list prices, recomputed here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bucketq import Bucketq
from bucketq.bench import served
from bucketq.bench.backends import Backend, open_backend
from bucketq.bench.fleet import open_fleet
from bucketq.bench.idle import Members, PickupTimeout, run_pickups
from bucketq.bench.idle_sidecar import sidecar_env
from bucketq.bench.metering import Meter
from bucketq.bench.params import BenchParams
from bucketq.bench.runner import run_scenarios
from bucketq.bench.served import ServedStore
from bucketq.bench.tracker import Tracker
from bucketq.bench.workers import Pacing, produce_paced
from bucketq.cli import app
from bucketq.config import Settings
from bucketq.errors import AlreadyExists, Closed
from bucketq.storage import MemoryStore
from tests.support.servers import S3Server
from tests.support.tcp_proxy import TcpProxy
from tests.support.virtual_tests import on_virtual_clock

# AWS S3 Standard list prices per 1,000 requests; DELETE is free; anything else is priced as GET.
USD_PER_1000 = {"PUT": 0.005, "POST": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
MONTH_MIN = 30 * 24 * 60


def bill(by_op: dict[str, int]) -> float:
    return sum(n * USD_PER_1000.get(op, 0.0004) / 1000 for op, n in by_op.items())


# Requests in flight when a window opens or closes are counted by the client (when sent) on one side
# of the edge and by the server (when answered) on the other: at most a few per connection.
IN_FLIGHT_PER_EDGE = 8


def assert_close_counts(server: int, client: int, edges: int = 2) -> None:
    """Both sides saw the same window(s), give or take the requests in flight at their edges."""
    assert server > 0 and client > 0
    assert abs(server - client) <= max(IN_FLIGHT_PER_EDGE * edges, 0.1 * client), (server, client, edges)


def assert_server_counted(run: dict[str, Any]) -> None:
    assert run["counted_at"] == "server", run
    by_op, by_method, calls = (
        run["server_requests_by_op"],
        run["server_requests_by_method"],
        run["server_calls_by_key"],
    )
    assert run["server_requests"] == sum(by_op.values()) == sum(by_method.values()) == sum(calls.values())
    edges = 6 if run["scenario"] == "idle" else 2  # idle: 1 member, 2 members, the pickups
    assert_close_counts(run["server_requests"], run["s3_requests"], edges)
    assert run["usd"] == pytest.approx(bill(by_op), rel=1e-12)  # priced from the SERVER counts
    assert run["usd"] > 0


def assert_clean(run: dict[str, Any]) -> None:
    assert (run["duplicates"], run["lost"], run["completed"]) == (0, 0, True), run


FAST = [
    "--messages",
    "100",
    "--producers",
    "2",
    "--consumers",
    "2",
    "--partitions",
    "4",
    "--warmup",
    "0.3",
    "--idle-seconds",
    "2.5",
    "--idle-warmup",
    "0.5",
    "--silence-seconds",
    "1",
    "--pickups",
    "2",
    "--rates",
    "20,100",
    "--rate-seconds",
    "1",
    "--tasks",
    "4",
]


@pytest.mark.s3
@pytest.mark.slow
def test_idle_cost_and_awaited_on_moto(tmp_path: Path) -> None:
    out = tmp_path / "bill.json"
    args = ["bench", "-b", "moto", "-s", "idle", "-s", "cost", "-s", "awaited", *FAST]
    result = CliRunner().invoke(app, [*args, "--profile", "latency", "--json", str(out)])
    assert result.exit_code == 0, result.output
    runs = json.loads(out.read_text())
    assert [r["scenario"] for r in runs] == ["idle", "cost", "cost", "awaited"]
    for run in runs:
        assert (run["backend"], run["profile"], run["partitions"]) == ("moto", "latency", 4)
        assert_server_counted(run)
        assert_clean(run)
    idle, cost_20, cost_100, awaited = runs
    check_idle(idle)
    for run, rate in ((cost_20, 20.0), (cost_100, 100.0)):
        check_cost(run, rate)
    check_awaited(awaited)
    for title in ("idle consumers", "cost per message", "req/msg", "counted at"):
        assert title in result.stdout


def check_idle(run: dict[str, Any]) -> None:
    extra = run["extra"]
    phases = extra["phases"]
    assert [(p["phase"], p["members"]) for p in phases] == [
        ("1 member", 1),
        ("2 members", 2),
        ("2 members + producer, between pickups", 2),
    ]
    for phase, seconds in zip(phases, (2.0, 2.0, 2 * 1.0), strict=True):
        assert seconds <= phase["seconds"] < seconds + 2.0, phase
        assert phase["counted_at"] == "server"
        server, client = (
            sum(phase["server_requests_by_op"].values()),
            sum(phase["client_requests_by_op"].values()),
        )
        assert_close_counts(server, client)
        assert phase["requests_per_min"] == pytest.approx(server * 60 / phase["seconds"], abs=1e-3)
        assert phase["usd_per_month"] == pytest.approx(
            bill(phase["server_requests_by_op"]) * 60 * MONTH_MIN / phase["seconds"], rel=1e-12
        )
        assert phase["usd_per_month_per_member"] == pytest.approx(phase["usd_per_month"] / phase["members"])
        assert sum(phase["requests_per_min_by_key"].values()) == pytest.approx(
            phase["requests_per_min"], abs=0.1
        )
    assert extra["usd_per_idle_month_per_member"] == phases[0]["usd_per_month"] > 0
    assert extra["member_increment"]["usd_per_month"] == pytest.approx(
        phases[1]["usd_per_month"] - phases[0]["usd_per_month"]
    )
    assert extra["sqs_usd_per_idle_month"] == pytest.approx(3 * MONTH_MIN * 0.40 / 1e6)
    assert run["usd_per_million_messages"] is None  # an idle queue has no price per message
    pickups = extra["pickups"]
    assert (pickups["count"], pickups["handled"], len(pickups["latencies_ms"])) == (2, 2, 2)
    assert run["messages"] == run["acked"] == 2
    assert 0 < run["p50_ms"] <= run["p99_ms"] == max(pickups["latencies_ms"])
    assert extra["pickup_p50_ms"] == run["p50_ms"]


def check_cost(run: dict[str, Any], rate: float) -> None:
    extra = run["extra"]
    assert extra["rate"] == rate
    assert run["messages"] == run["acked"] == min(100, math.ceil(rate * 1.0))
    assert (run["producers"], run["consumers"]) == (2, 2)
    assert run["usd_per_million_messages"] == pytest.approx(run["usd"] / run["messages"] * 1e6, rel=1e-12)
    assert run["sqs_usd_per_million_messages"] == pytest.approx(1.20)
    per_message = extra["requests_per_message_by_op"]
    assert sum(per_message.values()) == pytest.approx(run["server_requests"] / run["messages"], abs=1e-3)
    assert per_message.get("PUT", 0) > 0 and per_message.get("GET", 0) > 0
    assert run["msgs_per_s"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"]
    assert run["latency"] == "due time to receive"
    assert extra["peak_publishes_in_flight"] >= 1 and extra["max_schedule_lag_ms"] >= 0


def check_awaited(run: dict[str, Any]) -> None:
    assert (run["producers"], run["extra"]["tasks"], run["messages"], run["acked"]) == (1, 4, 100, 100)
    assert run["msgs_per_s"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"]
    assert run["latency"] == "publish call to durable"
    assert run["usd_per_million_messages"] == pytest.approx(run["usd"] / 100 * 1e6, rel=1e-12)


async def test_a_classic_scenario_is_counted_at_the_server_too(moto_server: S3Server) -> None:
    backend = Backend("moto", server=moto_server)
    params = BenchParams(backend="moto", scenarios=["e2e"], messages=200, producers=2, consumers=2)
    (run,) = [r.to_json() for r in await run_scenarios(backend, params)]
    assert_server_counted(run)
    assert_clean(run)
    assert run["profile"] == "balanced"  # the engine's default when none is asked for
    assert run["usd_per_million_messages"] == pytest.approx(run["usd"] / 200 * 1e6, rel=1e-12)


@on_virtual_clock
async def test_without_a_server_log_the_client_counts_are_billed() -> None:
    params = BenchParams(
        backend="memory",
        scenarios=["idle", "cost"],
        messages=50,
        producers=1,
        consumers=1,
        idle_seconds=1.0,
        idle_warmup_s=0.2,
        silence_s=0.2,
        pickups=1,
        rates=[50.0],
        rate_seconds=1.0,
        warmup_s=0.2,
        tuning={"profile": "economy"},
    )
    with open_backend("memory", params.tuning) as backend:
        runs = [r.to_json() for r in await run_scenarios(backend, params)]
    assert [r["scenario"] for r in runs] == ["idle", "cost"]
    for run in runs:
        assert (run["counted_at"], run["profile"]) == ("client", "economy")
        assert run["server_requests"] is None and run["server_calls_by_key"] is None
        assert run["usd"] == pytest.approx(bill(run["requests_by_op"]), rel=1e-12) and run["usd"] > 0
        assert_clean(run)
    for phase in runs[0]["extra"]["phases"]:
        assert phase["counted_at"] == "client" and phase["server_requests_by_op"] is None
        assert phase["usd_per_month"] == pytest.approx(
            bill(phase["client_requests_by_op"]) * 60 * MONTH_MIN / phase["seconds"], rel=1e-12
        )


async def test_a_pickup_nobody_handles_is_reported_lost() -> None:
    """No member listens: the message after the silence times out, is counted lost, and stops the run."""
    params = BenchParams(backend="memory", pickups=3, silence_s=0.0, idle_timeout_s=0.3)
    with open_backend("memory") as backend:
        fleet = await open_fleet(backend, "bench-idle", 2)
        try:
            members = Members(fleet, Tracker(expected=params.pickups))
            producer = await (await fleet.run.connect()).register_producer("p")
            silences, deliveries, errors = await run_pickups(
                members, producer, Meter(backend, fleet.run), params
            )
        finally:
            await fleet.run.close()
    assert errors == ["message 1 not handled within 0.3s"]
    assert (len(silences), len(deliveries)) == (1, 0)  # no further pickup after the first is lost
    assert (members.tracker.lost, members.tracker.acked) == (1, 0)
    with pytest.raises(PickupTimeout):
        await members.wait_handled(1, 0.0)


async def test_a_failed_listen_loop_stops_the_idle_run() -> None:
    with open_backend("memory") as backend:
        fleet = await open_fleet(backend, "bench-idle", 2)
        try:
            members = Members(fleet, Tracker(expected=1))
            await members.join()
            await members.consumers[0].close()  # its listen() loop now fails on the next poll
            with pytest.raises(Closed):
                await members.idle(3.0)
        finally:
            await members.close()
            await fleet.run.close()


async def test_paced_publishing_is_open_loop(moto_server: S3Server) -> None:
    """While the store does not answer, publishes keep starting on schedule (none waits for another)."""
    with TcpProxy.to(moto_server.endpoint_url) as proxy:
        bq = Bucketq(moto_server.settings(s3_endpoint_url=proxy.url, profile="latency"))
        await bq.open()
        try:
            await bq.create_topic("t", partitions=2)
            producer = await bq.register_producer("p")
            tracker, pacing = Tracker(expected=20), Pacing()
            proxy.down()
            started = time.monotonic()
            task = asyncio.create_task(
                produce_paced([producer], "t", 20, 50.0, tracker, payload_bytes=10, pacing=pacing)
            )
            await asyncio.sleep(0.8)  # all 20 were due by 0.38 s
            assert tracker.published == set()  # nothing got through
            assert pacing.in_flight == pacing.peak_in_flight == 20
            assert pacing.max_lag_s < 0.3
            proxy.up()
            await asyncio.wait_for(task, 60)
            assert (len(tracker.published), tracker.publish_errors) == (20, 0)
            assert time.monotonic() - started >= 0.8
        finally:
            await bq.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rates", "1,x"], "invalid --rates"),
        (["--rates", "10,0"], "positive"),
        (["--idle-seconds", "10", "--idle-warmup", "10"], "idle_seconds must be longer"),
        (["--profile", "economy", "--set", "profile=latency"], "disagree"),
        (["--backend", "moto", "--service-ms", "4"], "memory backend"),
        (["--via", "sidecar", "--backend", "moto", "--service-ms", "4"], "real servers"),
        (["--service-servers", "2"], "only with service_ms"),
        (["--via", "sidecar", "--backend", "moto", "--service-servers", "2"], "real servers"),
    ],
)
def test_bad_bill_parameters_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["bench", "-s", "cost", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_bench_params_reject_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="pickups"):
        BenchParams(pickups=0)
    with pytest.raises(ValueError, match="silence_s"):
        BenchParams(silence_s=-1)
    with pytest.raises(ValueError, match="rates"):
        BenchParams(rates=[])
    with pytest.raises(ValueError, match="rate_seconds"):
        BenchParams(rate_seconds=0)
    with pytest.raises(ValueError, match="memory backend"):
        BenchParams(backend="moto", service_ms=4)
    with pytest.raises(ValueError, match="must not be negative"):
        BenchParams(service_ms=-1)
    with pytest.raises(ValueError, match="service_servers"):
        BenchParams(service_ms=4, service_servers=0)
    assert BenchParams(tuning={"profile": "economy"}).profile == "economy"
    assert BenchParams().profile is None


async def test_the_served_model_answers_one_request_at_a_time() -> None:
    """``--service-ms``: requests queue for one server; the answers are the in-memory store's."""
    store = ServedStore(MemoryStore(), 0.05)
    await store.put("a", b"1")
    started = time.monotonic()
    blobs = await asyncio.gather(*(store.get("a") for _ in range(4)), store.head("b"))
    assert time.monotonic() - started >= 5 * 0.05 - 0.005, "five requests served one after another"
    assert [b.data for b in blobs[:4] if b is not None] == [b"1"] * 4 and blobs[4] is None
    with pytest.raises(AlreadyExists):
        await store.put("a", b"2", if_none_match=True)
    assert [info.key async for info in store.list("")] == ["a"]
    assert store.stats.requests["GET"] == 4


@pytest.mark.parametrize("servers", [1, 3])
async def test_the_served_model_answers_as_many_requests_at_once_as_it_has_servers(
    servers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--service-servers``: at most that many requests are in service at once, and that many are
    when that many wait (counted inside the service time, not timed)."""
    in_service = [0, 0]  # now, most
    service_s = 0.01
    real_sleep = asyncio.sleep

    async def serve(seconds: float) -> None:
        if seconds != service_s:  # the in-memory store's own yields
            await real_sleep(seconds)
            return
        in_service[0] += 1
        in_service[1] = max(in_service[1], in_service[0])
        await real_sleep(seconds)
        in_service[0] -= 1

    monkeypatch.setattr(served.asyncio, "sleep", serve)
    store = ServedStore(MemoryStore(), service_s, servers)
    await asyncio.gather(*(store.get(f"k{i}") for i in range(8)))
    assert in_service == [0, servers]
    assert store.stats.requests["GET"] == 8
    with pytest.raises(ValueError, match="at least one"):
        ServedStore(MemoryStore(), 0.01, 0)


def test_a_bench_on_the_served_model_is_labelled_with_its_speed(tmp_path: Path) -> None:
    out = tmp_path / "served.json"
    result = CliRunner().invoke(
        app,
        [
            *("bench", "-s", "e2e", "-n", "40", "--producers", "1", "--consumers", "1"),
            *("--partitions", "1", "--service-ms", "2", "--json", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())
    assert (run["backend"], run["messages"], run["lost"], run["duplicates"]) == ("memory@2ms", 40, 0, 0)
    out.unlink()
    result = CliRunner().invoke(
        app,
        [
            *("bench", "-s", "e2e", "-n", "40", "--producers", "1", "--consumers", "1"),
            *("--partitions", "1", "--service-ms", "2", "--service-servers", "4", "--json", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())
    assert (run["backend"], run["lost"], run["duplicates"]) == ("memory@2msx4", 0, 0)


@pytest.mark.s3
@pytest.mark.slow
def test_idle_sidecars_whose_apps_long_poll_are_counted_at_the_server(tmp_path: Path) -> None:
    """``-s idle --via sidecar``: the members are sidecar processes, their apps long-poll, and the
    bill is the server's count (the sidecars' connections are not the bench's own)."""
    out = tmp_path / "idle-sidecar.json"
    args = ["bench", "-b", "moto", "-s", "idle", "--via", "sidecar", "--json", str(out)]
    fast = ["--idle-seconds", "2.5", "--idle-warmup", "0.5", "--silence-seconds", "1", "--pickups", "2"]
    # a heartbeat every half second (the sidecars take the run's --set): each measured window of a
    # second or more holds one, wherever it falls after the sidecars started
    beats = ["--set", "consumer.heartbeat_interval_s=0.5", "--set", "consumer.heartbeat_idle_s=0.5"]
    result = CliRunner().invoke(app, [*args, *fast, *beats])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())
    assert (run["scenario"], run["via"], run["consumers"]) == ("idle", "sidecar", 2)
    assert_clean(run)
    assert run["counted_at"] == "server" and run["usd"] == pytest.approx(bill(run["server_requests_by_op"]))
    phases = run["extra"]["phases"]
    for phase in phases[:2]:
        # the sidecars' own requests: the bench's connections made none while nobody published
        assert sum(phase["client_requests_by_op"].values()) == 0, phase
        assert phase["requests_per_min"] > 0 and phase["usd_per_month"] > 0, phase
    assert "PUT member" in run["server_calls_by_key"]  # the sidecars' heartbeats, seen by the server
    pickups = run["extra"]["pickups"]
    assert (pickups["handled"], len(pickups["latencies_ms"])) == (2, 2)


def test_sidecar_members_run_with_the_runs_engine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar member reads from its environment the engine settings the run has: the profile's
    values and every --set, so ``--via sidecar`` measures what it was asked to."""
    run = Settings.from_dict(
        {
            "s3_bucket": "bench",
            "s3_endpoint_url": "http://127.0.0.1:9",
            "profile": "economy",
            "producer": {"linger_ms": 7},
            "consumer": {"heartbeat_interval_s": 1.5, "ordered": True, "start_position": "latest"},
            "csprng": {"verify_retries": 5},
        }
    )
    env = sidecar_env(run, "workers", "orders")
    for key in [k for k in os.environ if k.startswith("BUCKETQ_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    member = Settings.load()
    assert (member.profile, member.csprng, member.producer, member.consumer) == (
        run.profile,
        run.csprng,
        run.producer,
        run.consumer,
    )
    # the --set values, and the profile's where nothing was set
    assert (member.producer.linger_ms, member.consumer.heartbeat_interval_s) == (7, 1.5)
    assert member.consumer.ordered and member.consumer.start_position == "latest"
    assert member.csprng.verify_retries == 5
    assert (
        member.consumer.commit_linger_ms
        == Settings.from_dict({"profile": "economy", "backend": "memory"}).consumer.commit_linger_ms
    )


def test_idle_via_sidecar_needs_a_real_server_and_the_idle_scenario_alone() -> None:
    for args in (["-b", "memory", "-s", "idle"], ["-b", "moto", "-s", "idle", "-s", "cost"]):
        result = CliRunner().invoke(app, ["bench", *args, "--via", "sidecar"])
        assert result.exit_code != 0
        assert "sidecar" in result.output, result.output
