"""Day-to-day operations from the CLI alone, against moto server and SeaweedFS: peek, consume
--follow/--dead-letter, consumer list/describe/delete/seek, dlq list/show/redrive, gc with
retention limits, --namespace and --version (docs/operations.md walks through the same steps)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from bucketq.cli import app
from bucketq.cli.errors import EXIT_USAGE
from tests.support.servers import S3Server

runner = CliRunner()

pytestmark = pytest.mark.s3


@pytest.fixture(autouse=True)
def _no_bucketq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("BUCKETQ_"):
            monkeypatch.delenv(name)


class Cli:
    """Runs ``bucketq`` commands against one fresh bucket of an S3 server (settings in a YAML file)."""

    def __init__(self, backend: str, server: S3Server, tmp_path: Path) -> None:
        self.backend = backend
        self.config = tmp_path / "bucketq.yaml"
        self.config.write_text(yaml.safe_dump(server.settings_dict()))

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return runner.invoke(app, ["--config", str(self.config), *args], input=input)

    def ok(self, *args: str, input: str | None = None) -> Result:
        result = self(*args, input=input)
        assert result.exit_code == 0, f"bucketq {' '.join(args)} -> exit {result.exit_code}: {result.output}"
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)

    def lines(self, *args: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.ok(*args, "--json").stdout.splitlines() if line.strip()]


@pytest.fixture(params=["moto", "seaweedfs"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    server: S3Server = request.getfixturevalue(f"{request.param}_server")
    return Cli(request.param, server, tmp_path)


def _publish(cli: Cli, topic: str, n: int) -> None:
    payloads = "".join(json.dumps({"n": i}) + "\n" for i in range(n))
    out = cli.ok("publish", topic, input=payloads)
    assert f"published {n} messages" in out.stdout


def _sub(cli: Cli, topic: str, consumer: str) -> dict[str, Any]:
    return cli.json("consumer", "describe", topic, consumer)


# The scenario's size per backend. Its full size, 10,000 messages (about ten 1,000-message segments
# per publish), runs once, on SeaweedFS; on moto, the backend docs/operations.md runs on (with 2,000
# messages, tests/cli/test_walkthroughs.py), the same steps and assertions run at the page's size:
# what moto adds is a second store under every step, not more messages (still two segments or more).
SCENARIO_MESSAGES = {"seaweedfs": 10_000, "moto": 2_000}


@pytest.mark.slow  # half a minute to a minute and a half: dealt first on the xdist workers
def test_the_operations_walkthrough(cli: Cli) -> None:
    """publish 10,000 (2,000 on moto); consume half with group A; peek 5 messages 10 times;
    dead-letter 20 via nack; redrive them at 50 msg/s; seek group A to earliest; delete group B;
    let A go inactive past its timeout: nothing counted twice, nothing dead-lettered by peeking."""
    total = SCENARIO_MESSAGES[cli.backend]
    half = total // 2
    cli.ok(
        "topic", "create", "orders", "--partitions", "4", "--retention", "1s", "--subscription-timeout", "2s"
    )
    _publish(cli, "orders", total)

    consumed = cli.lines("consume", "orders", "-c", "group-a", "-n", str(half))
    assert len(consumed) == half
    assert len({(m["partition"], m["offset"]) for m in consumed}) == half  # nothing twice
    assert _sub(cli, "orders", "group-a")["acked"] == half

    # peeking: the same five messages every time, and no delivery counted anywhere
    seen = [[m["id"] for m in cli.lines("peek", "orders", "-n", "5")] for _ in range(10)]
    assert all(ids == seen[0] for ids in seen) and len(seen[0]) == 5
    window = cli.lines("peek", "orders", "-c", "group-a", "-n", "5")
    assert [m["state"] for m in window] == ["pending"] * 5
    assert all(m["deliveries"] == 0 for m in window)
    assert _sub(cli, "orders", "group-a")["dead_lettered"] == 0

    # dead-letter 20 through group B, then move them back at 50 msg/s
    dead = cli.lines("consume", "orders", "-c", "group-b", "-n", "20", "--dead-letter")
    assert len(dead) == 20
    listed = cli.json("dlq", "list")
    assert listed == [{"topic": "orders", "dlq": "orders.dlq", "messages": 20, "waiting": 20}]
    shown = cli.lines("dlq", "show", "orders", "-n", "50")
    assert len(shown) == 20
    assert {m["headers"]["bucketq-dlq-reason"] for m in shown} == {"nack"}
    before = {p["partition"]: p["messages"] for p in cli.json("topic", "describe", "orders")["partitions"]}
    started = time.monotonic()
    report = cli.json("dlq", "redrive", "orders", "--rate", "50")
    assert time.monotonic() - started >= 19 / 50  # paced
    assert report["moved"] == 20 and report["acked"] == 20 and report["duplicates"] == 0
    assert cli.json("dlq", "redrive", "orders")["moved"] == 0  # idempotent: nothing left to move
    assert cli.json("dlq", "list")[0]["waiting"] == 0
    assert cli.json("topic", "describe", "orders")["messages"] == total + 20
    redriven = [
        m
        for p, offset in before.items()
        for m in cli.lines("peek", "orders", "-p", str(p), "--offset", str(offset), "-n", "50")
    ]
    assert sorted(m["id"] for m in redriven) == sorted(m["id"] for m in dead)  # same messages, once
    assert all(m["headers"] == {"bucketq-redrive-for": "group-b"} for m in redriven)

    # seek group A back to the start: every member agrees, the first messages come again (I11)
    moved = cli.json("consumer", "seek", "orders", "group-a", "--to", "earliest", "--yes")
    assert {v["offset"] for v in moved.values()} == {0}
    again = cli.lines("consume", "orders", "-c", "group-a", "-n", "8")
    assert len(again) == 8 and {m["offset"] for m in again} <= set(range(8))

    cli.ok("consumer", "delete", "orders", "group-b", "--yes")
    assert [s["consumer"] for s in cli.json("consumer", "list", "orders")] == ["group-a"]

    # group A has no member and writes nothing: past the topic's timeout GC stops waiting for it
    time.sleep(2.5)
    report = cli.json("gc", "orders")
    assert report["abandoned_subscriptions"] == ["orders/group-a"]
    assert report["expired_unconsumed"] > 0  # the fence rose over what A had not consumed
    assert _sub(cli, "orders", "group-a")["dead_lettered"] == 0


def test_peek_from_an_offset_a_time_and_a_window(cli: Cli) -> None:
    cli.ok("topic", "create", "events", "--partitions", "2")
    _publish(cli, "events", 40)
    sizes = {p["partition"]: p["messages"] for p in cli.json("topic", "describe", "events")["partitions"]}
    busy = max(sizes, key=lambda p: sizes[p])  # one publisher fills partitions in sticky runs
    at_offset = cli.lines("peek", "events", "-p", str(busy), "--offset", "5", "-n", "3")
    assert [(m["partition"], m["offset"]) for m in at_offset] == [(busy, 5), (busy, 6), (busy, 7)]
    past_end = cli.lines("peek", "events", "-p", str(busy), "--offset", str(sizes[busy]))
    assert past_end == []
    assert cli.lines("peek", "events", "--since", str(time.time() + 60)) == []
    assert len(cli.lines("peek", "events", "--since", "10m", "-n", "100")) == 40
    cli.ok("consume", "events", "-c", "reader", "-n", "10")
    window = cli.lines("peek", "events", "-c", "reader", "-n", "100")
    assert len(window) == 30 and {m["state"] for m in window} == {"pending"}
    assert len(cli.lines("peek", "events", "-c", "reader", "-n", "100", "--include-done")) == 40


def test_no_ack_gives_messages_back_uncounted(cli: Cli) -> None:
    cli.ok("topic", "create", "looks", "--max-deliveries", "2")
    _publish(cli, "looks", 3)
    for _ in range(4):  # more looks than deliveries allowed: never dead-lettered
        assert len(cli.lines("consume", "looks", "-c", "viewer", "-n", "3", "--no-ack")) == 3
    sub = _sub(cli, "looks", "viewer")
    assert sub["dead_lettered"] == 0 and sub["backlog"] == 3


def test_bad_input_is_a_clear_usage_error(cli: Cli) -> None:
    cli.ok("topic", "create", "things")
    for args, fragment in (
        (("peek", "things", "--offset", "1", "--since", "1h"), "not both"),
        (("peek", "things", "--since", "yesterday"), "an age such as 15m or 1h30m"),
        (("peek", "things", "-p", "7"), "partitions 0..0"),
        (("peek", "things", "-c", "nobody"), "no subscription"),
        (("consumer", "describe", "things", "nobody"), "no subscription"),
        (("consumer", "seek", "things", "nobody", "--to", "earliest", "--yes"), "no subscription"),
        (("dlq", "show", "things"), "no dead letters yet"),
        (("consume", "things", "-c", "x", "--no-ack", "--dead-letter"), "not both"),
        (("peek", "missing"), "unknown topic"),
    ):
        result = cli(*args)
        assert result.exit_code == EXIT_USAGE, f"{args}: exit {result.exit_code}: {result.output}"
        assert fragment in result.stderr, f"{args}: {result.stderr}"
        assert "Traceback" not in result.output


def test_namespace_reads_the_operators_layout(cli: Cli) -> None:
    """The operator keeps namespace NS under ROOT/NS: --namespace NS finds it without --root."""
    cli.ok("--root", "bucketq/team-a", "topic", "create", "jobs")
    assert cli.json("--namespace", "team-a", "--root", "bucketq", "topic", "list") == ["jobs"]
    assert cli.json("--root", "bucketq", "topic", "list") == []


def test_version() -> None:
    from bucketq import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"bucketq {__version__}"
