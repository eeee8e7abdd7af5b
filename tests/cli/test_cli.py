"""The ``bucketq`` CLI on the memory and file backends and against a moto server."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from bucketq.cli import app
from bucketq.cli.connection import Connection
from bucketq.cli.errors import EXIT_ERROR, EXIT_STORAGE, EXIT_USAGE
from tests.support.servers import S3Server, free_ports

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_bucketq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the environment they need; nothing leaks in from outside."""
    import os

    for name in list(os.environ):
        if name.startswith("BUCKETQ_"):
            monkeypatch.delenv(name)


def invoke(*args: str, input: str | None = None) -> Result:
    return runner.invoke(app, list(args), input=input)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}"
    return result


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_error(result: Result, code: int, *fragments: str) -> None:
    """Exit ``code``, exactly one red error line on stderr naming ``fragments``, no traceback."""
    assert result.exit_code == code, f"exit {result.exit_code}: {result.output}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0]
    assert "Traceback" not in result.output


class FileCli:
    """Runs commands against one directory-backed bucket."""

    def __init__(self, path: Path) -> None:
        self.flags = ["--backend", "file", "--file-path", str(path)]

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return invoke(*self.flags, *args, input=input)


@pytest.fixture
def cli(tmp_path: Path) -> FileCli:
    return FileCli(tmp_path / "bucket")


# -- help and wiring ---------------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    result = ok(invoke("--help"))
    for name in ("topic", "publish", "consume", "stats", "bench", "demo"):
        assert name in result.output


def test_module_entry_point_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bucketq.cli", "topic", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "create" in proc.stdout


# -- topics ------------------------------------------------------------------------------------


# no writer runs across the deletion: its 7 s wait would prove nothing here
@pytest.mark.usefixtures("quick_topic_deletion")
def test_topic_create_list_describe_delete(cli: FileCli) -> None:
    created = ok(
        cli(
            "topic",
            "create",
            "orders",
            "--partitions",
            "3",
            "--retention",
            "2d",
            "--max-message-bytes",
            "4096",
            "--max-deliveries",
            "3",
            "--dead-letter-topic",
            "orders-dead",
        )
    )
    assert "created topic orders" in created.stdout
    again = ok(cli("topic", "create", "orders", "--partitions", "5"))
    assert "already exists" in again.stdout
    assert "partitions" in again.stderr  # warns that the existing config is kept

    assert json.loads(ok(cli("topic", "list", "--json")).stdout) == ["orders"]
    assert "orders" in ok(cli("topic", "list")).stdout

    info = json.loads(ok(cli("topic", "describe", "orders", "--json")).stdout)
    assert info["config"]["partitions"] == 3
    assert info["config"]["retention_seconds"] == 2 * 86400
    assert info["config"]["max_message_bytes"] == 4096
    assert info["config"]["dead_letter"]["max_deliveries"] == 3
    assert info["dead_letter_topic"] == "orders-dead"
    assert [p["partition"] for p in info["partitions"]] == [0, 1, 2]
    assert "dead letters" in ok(cli("topic", "describe", "orders")).stdout

    deleted = ok(cli("topic", "delete", "orders", "--yes"))
    assert "deleted topic orders" in deleted.stdout
    assert json.loads(ok(cli("topic", "list", "--json")).stdout) == []
    assert_error(cli("topic", "describe", "orders"), EXIT_USAGE, "unknown topic 'orders'")


# no writer runs across the deletion: its 7 s wait would prove nothing here
@pytest.mark.usefixtures("quick_topic_deletion")
def test_topic_delete_no_purge_keeps_messages(cli: FileCli, tmp_path: Path) -> None:
    ok(cli("topic", "create", "keep"))
    ok(cli("publish", "keep", "1"))
    ok(cli("topic", "delete", "keep", "--no-purge", "--yes"))
    assert json.loads(ok(cli("topic", "list", "--json")).stdout) == []
    assert any(p.name.endswith(".jsonl") for p in (tmp_path / "bucket").rglob("*"))


def test_memory_backend_starts_empty() -> None:
    assert "no topics" in ok(invoke("--backend", "memory", "topic", "list")).stdout
    assert_error(invoke("--backend", "memory", "publish", "nowhere", "1"), EXIT_USAGE, "unknown topic")


# -- publish, consume, stats -------------------------------------------------------------------


def test_publish_consume_no_ack_then_ack_and_stats(cli: FileCli) -> None:
    ok(cli("topic", "create", "jobs", "--partitions", "2"))
    published = json_lines(
        ok(cli("publish", "jobs", '{"a": 1}', "[1, 2]", "--key", "k", "-H", "x=y", "--json")).stdout
    )
    assert len(published) == 2
    assert len({p["partition"] for p in published}) == 1  # one key, one partition
    piped = ok(cli("publish", "jobs", input='{"n": 1}\n\n"two"\n3\n'))
    assert "published 3 messages" in piped.stdout

    peeked = json_lines(
        ok(
            cli(
                "consume", "jobs", "--consumer", "workers", "--max", "5", "--wait", "10", "--json", "--no-ack"
            )
        ).stdout
    )
    assert len(peeked) == 5
    assert {m["id"] for m in peeked} >= {p["id"] for p in published}
    assert not any(m["acked"] for m in peeked)
    first = next(m for m in peeked if m["id"] == published[0]["id"])
    assert first["payload"] == {"a": 1} and first["key"] == "k" and first["headers"] == {"x": "y"}

    consumed = json_lines(
        ok(cli("consume", "jobs", "--consumer", "workers", "--max", "5", "--wait", "10", "--json")).stdout
    )
    assert {m["id"] for m in consumed} == {m["id"] for m in peeked}
    # --no-ack gives messages back uncounted: looking is not a failed delivery (it used to count,
    # and five looks dead-lettered a message)
    assert all(m["acked"] and m["deliveries"] == 1 for m in consumed)
    assert sorted(json.dumps(m["payload"]) for m in consumed) == sorted(
        json.dumps(v) for v in ({"a": 1}, [1, 2], {"n": 1}, "two", 3)
    )

    empty = ok(cli("consume", "jobs", "--consumer", "workers", "--wait", "0.5"))
    assert empty.stdout == "" and "no messages" in empty.stderr

    (row,) = json.loads(ok(cli("stats", "jobs", "--json")).stdout)
    assert (row["topic"], row["consumer"], row["messages"], row["backlog"], row["acked"]) == (
        "jobs",
        "workers",
        5,
        0,
        5,
    )
    table = ok(cli("stats")).stdout
    # stdout is not a terminal here: plain columns with kubectl-style headers
    assert table.splitlines()[0].split() == [
        "TOPIC",
        "CONSUMER",
        "MESSAGES",
        "BACKLOG",
        "LEASED",
        "DEAD-LETTERED",
        "OLDEST",
    ]
    assert "workers" in table


def test_consume_prints_text_and_acks(cli: FileCli) -> None:
    ok(cli("topic", "create", "texts"))
    ok(cli("publish", "texts", "--raw", "hello world", "--key", "greeting"))
    printed = ok(cli("consume", "texts", "--consumer", "readers", "--max", "1", "--wait", "10"))
    assert "hello world" in printed.stdout and "key=greeting" in printed.stdout
    (row,) = json.loads(ok(cli("stats", "texts", "--consumer", "readers", "--json")).stdout)
    assert row["acked"] == 1 and row["backlog"] == 0


def test_consume_waits_from_the_first_look_not_from_the_join(
    cli: FileCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a slow store the member's first look outlasts a short --wait: the messages waiting are
    still printed, never a "no messages" line for a queue that has them."""
    from bucketq.storage.filesystem import FileStore

    ok(cli("topic", "create", "slow"))
    ok(cli("publish", "slow", "1", "2", "3"))
    plain_get = FileStore.get

    async def slow_get(self: FileStore, key: str) -> Any:
        if "/seg/" in key:
            await asyncio.sleep(0.5)
        return await plain_get(self, key)

    monkeypatch.setattr(FileStore, "get", slow_get)
    got = json_lines(ok(cli("consume", "slow", "-c", "c", "-n", "3", "--wait", "0.1", "--json")).stdout)
    assert sorted(m["payload"] for m in got) == [1, 2, 3]


def test_publish_raw_keeps_bytes_and_content_type(cli: FileCli) -> None:
    ok(cli("topic", "create", "raw"))
    ok(cli("publish", "raw", "--raw", "--content-type", "text/csv", "a,b"))
    (msg,) = json_lines(
        ok(cli("consume", "raw", "--consumer", "c", "--max", "1", "--wait", "10", "--json")).stdout
    )
    assert base64.b64decode(msg["data_b64"]) == b"a,b"
    assert msg["content_type"] == "text/csv"


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stdin", "fragments"),
    [
        (["publish", "bad", "{nope"], None, ["invalid JSON payload (argument 1)"]),
        (["publish", "bad", "1", "[1,"], None, ["invalid JSON payload (argument 2)"]),
        (["publish", "bad"], '{"ok": 1}\nnot json\n', ["invalid JSON payload (stdin line 2)"]),
        (["publish", "bad"], "\n\n", ["nothing to publish"]),
        (["publish", "bad", "1", "--header", "novalue"], None, ["invalid header"]),
        (["publish", "bad", "1", "--content-type", "text/plain"], None, ["--content-type needs --raw"]),
        (["publish", "missing", "1"], None, ["unknown topic 'missing'"]),
        (["publish", "Bad_Topic", "1"], None, ["invalid topic name"]),
        (["consume", "missing", "--consumer", "c"], None, ["unknown topic 'missing'"]),
        (["consume", "bad", "--consumer", "Bad Group"], None, ["invalid consumer name"]),
        (["stats", "missing"], None, ["unknown topic 'missing'"]),
        (["topic", "create", "ends-with-dash-"], None, ["invalid topic name"]),
        (["topic", "create", "UPPER"], None, ["invalid topic name"]),
        (["topic", "create", "t2", "--retention", "soon"], None, ["invalid duration"]),
        (["topic", "create", "t2", "--max-message-bytes", "1"], None, ["max_message_bytes"]),
        (["topic", "create", "t2", "--dead-letter-topic", "No"], None, ["dead-letter topic name"]),
        (["topic", "describe", "missing"], None, ["unknown topic"]),
        (["topic", "delete", "missing", "--yes"], None, ["unknown topic"]),
        (["topic", "delete", "bad"], None, ["without --yes"]),
    ],
)
def test_bad_input_exits_2_with_one_line(
    cli: FileCli, args: list[str], stdin: str | None, fragments: list[str]
) -> None:
    ok(cli("topic", "create", "bad"))
    assert_error(cli(*args, input=stdin), EXIT_USAGE, *fragments)
    info = json.loads(ok(cli("topic", "describe", "bad", "--json")).stdout)
    assert info["messages"] == 0  # bad input changes nothing


def test_oversize_message_is_rejected_before_anything_is_sent(cli: FileCli) -> None:
    ok(cli("topic", "create", "small", "--max-message-bytes", "400"))
    big = json.dumps({"blob": "x" * 1000})
    assert_error(
        cli("publish", "small", '{"fits": true}', big), EXIT_USAGE, "max_message_bytes limit of 400 bytes"
    )
    assert json.loads(ok(cli("topic", "describe", "small", "--json")).stdout)["messages"] == 0


def test_usage_errors_exit_2() -> None:
    assert invoke("consume", "t").exit_code == EXIT_USAGE  # --consumer is required
    assert invoke("bench", "--backend", "nowhere").exit_code == EXIT_USAGE
    assert invoke("no-such-command").exit_code == EXIT_USAGE


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("backend: [file\n", "not valid YAML"),
        ("backend: file\nfile_path: /tmp/x\nno_such_setting: 1\n", "no_such_setting"),
        ("- just\n- a list\n", "must hold a mapping"),
        ("backend: file\nstrategy: sometimes\nfile_path: /tmp/x\n", "strategy"),
    ],
)
def test_malformed_config_exits_2(tmp_path: Path, text: str, fragment: str) -> None:
    config = tmp_path / "bucketq.yaml"
    config.write_text(text)
    assert_error(invoke("--config", str(config), "topic", "list"), EXIT_USAGE, fragment)


def test_missing_config_file_and_bad_flags_exit_2(tmp_path: Path) -> None:
    assert_error(invoke("--config", str(tmp_path / "none.yaml"), "topic", "list"), EXIT_USAGE, "cannot read")
    assert_error(invoke("--backend", "tape", "topic", "list"), EXIT_USAGE, "backend")
    assert_error(
        invoke("--backend", "s3", "topic", "list"),
        EXIT_USAGE,
        "no bucket configured",
        "BUCKETQ_S3_BUCKET",
        "bucketq dev",
    )


@pytest.mark.timeout(30)
def test_unreachable_endpoint_exits_3() -> None:
    (port,) = free_ports(1)  # nothing listens there
    result = invoke(
        "--endpoint-url",
        f"http://127.0.0.1:{port}",
        "--bucket",
        "b",
        "--access-key-id",
        "k",
        "--secret-access-key",
        "s",
        "topic",
        "list",
    )
    assert_error(result, EXIT_STORAGE, "cannot reach S3 endpoint")


# -- settings precedence -----------------------------------------------------------------------


def test_settings_precedence_flags_over_yaml_over_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "bucketq.yaml"
    config.write_text("s3_bucket: from-yaml\nroot: yaml-root\nproducer:\n  linger_ms: 7\n")
    monkeypatch.setenv("BUCKETQ_S3_BUCKET", "from-env")
    monkeypatch.setenv("BUCKETQ_S3_REGION", "eu-west-1")
    monkeypatch.setenv("BUCKETQ_ROOT", "env-root")
    monkeypatch.setenv("BUCKETQ_PRODUCER__MAX_BATCH_MESSAGES", "9")

    from_env = Connection().settings()
    assert (from_env.s3_bucket, from_env.s3_region, from_env.root) == ("from-env", "eu-west-1", "env-root")

    with_yaml = Connection(config=config).settings()
    assert (with_yaml.s3_bucket, with_yaml.root, with_yaml.s3_region) == (
        "from-yaml",
        "yaml-root",
        "eu-west-1",
    )
    assert (with_yaml.producer.linger_ms, with_yaml.producer.max_batch_messages) == (7, 9)

    with_flags = Connection(
        config=config, bucket="from-flag", region="ap-south-1", strategy="csprng_verify"
    ).settings()
    assert (with_flags.s3_bucket, with_flags.s3_region, with_flags.root) == (
        "from-flag",
        "ap-south-1",
        "yaml-root",
    )
    assert with_flags.strategy == "csprng_verify"


# -- against a moto server ---------------------------------------------------------------------


def moto_flags(server: S3Server, bucket: str) -> list[str]:
    return [
        "--endpoint-url",
        server.endpoint_url,
        "--bucket",
        bucket,
        "--access-key-id",
        server.access_key,
        "--secret-access-key",
        server.secret_key,
    ]


@pytest.mark.s3
# no writer runs across the deletion: its 7 s wait would prove nothing here
@pytest.mark.usefixtures("quick_topic_deletion")
def test_cli_against_moto(moto_server: S3Server) -> None:
    flags = moto_flags(moto_server, moto_server.new_bucket())
    ok(invoke(*flags, "topic", "create", "events", "--partitions", "2"))
    assert json.loads(ok(invoke(*flags, "topic", "list", "--json")).stdout) == ["events"]
    ok(invoke(*flags, "publish", "events", input="".join(f'{{"n": {i}}}\n' for i in range(20))))
    assert json.loads(ok(invoke(*flags, "topic", "describe", "events", "--json")).stdout)["messages"] == 20

    got = json_lines(
        ok(
            invoke(*flags, "consume", "events", "--consumer", "svc", "--max", "20", "--wait", "10", "--json")
        ).stdout
    )
    assert sorted(m["payload"]["n"] for m in got) == list(range(20))
    (row,) = json.loads(ok(invoke(*flags, "stats", "--json")).stdout)
    assert (row["consumer"], row["backlog"], row["in_flight"], row["acked"]) == ("svc", 0, 0, 20)
    ok(invoke(*flags, "topic", "delete", "events", "--yes"))
    assert json.loads(ok(invoke(*flags, "topic", "list", "--json")).stdout) == ["events.dlq"]


@pytest.mark.s3
def test_moto_settings_from_env_yaml_and_flags(
    moto_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_server.new_bucket()
    monkeypatch.setenv("BUCKETQ_S3_ENDPOINT_URL", moto_server.endpoint_url)
    monkeypatch.setenv("BUCKETQ_S3_ACCESS_KEY_ID", moto_server.access_key)
    monkeypatch.setenv("BUCKETQ_S3_SECRET_ACCESS_KEY", moto_server.secret_key)
    monkeypatch.setenv("BUCKETQ_S3_BUCKET", "no-such-bucket")

    assert_error(invoke("topic", "list"), EXIT_STORAGE, "no-such-bucket")  # env alone: wrong bucket
    ok(invoke("--bucket", bucket, "topic", "create", "from-flag"))  # the flag overrides env
    config = tmp_path / "bucketq.yaml"
    config.write_text(f"s3_bucket: {bucket}\nstrategy: conditional_write\n")
    assert json.loads(ok(invoke("--config", str(config), "topic", "list", "--json")).stdout) == ["from-flag"]
    assert_error(invoke("--config", str(config), "--bucket", "no-such-bucket", "topic", "list"), EXIT_STORAGE)


def test_exit_codes_are_distinct() -> None:
    assert len({EXIT_ERROR, EXIT_USAGE, EXIT_STORAGE}) == 3
