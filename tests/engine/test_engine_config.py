"""Building a connection: env, YAML, dict, builder; strategies; and the clear errors on bad config."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from bucketq import Bucketq, ConfigError, Settings, StorageError
from bucketq.storage import MemoryStore
from tests.support.engine_helpers import Backend, drain


def test_settings_from_env_yaml_dict_and_builder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BUCKETQ_S3_BUCKET", "from-env")
    monkeypatch.setenv("BUCKETQ_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BUCKETQ_STRATEGY", "csprng_verify")
    monkeypatch.setenv("BUCKETQ_PRODUCER__LINGER_MS", "7")
    s = Settings.load(s3_region="eu-west-1")
    assert (s.s3_bucket, s.strategy, s.producer.linger_ms, s.s3_region) == (
        "from-env",
        "csprng_verify",
        7,
        "eu-west-1",
    )
    assert Settings.load(s3_bucket="flag").s3_bucket == "flag"  # explicit values beat env
    yaml_file = tmp_path / "bucketq.yaml"
    yaml_file.write_text(
        "s3_bucket: from-yaml\ns3_endpoint_url: http://x\nconsumer:\n  visibility_timeout_s: 9\n"
    )
    y = Settings.from_yaml(yaml_file)
    assert (y.s3_bucket, y.consumer.visibility_timeout_s, y.strategy) == (
        "from-yaml",
        9,
        "auto",
    )  # env ignored
    b = (
        Bucketq.builder()
        .s3("built", endpoint_url="http://y")
        .strategy("conditional_write")
        .producer(linger_ms=1)
    )
    assert (b.settings().s3_bucket, b.settings().producer.linger_ms) == ("built", 1)
    assert "hunter2" not in str(
        Settings.from_dict({"s3_bucket": "b", "s3_secret_access_key": "hunter2"}).redacted()
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"backend": "s3"}, "needs s3_bucket"),
        ({"backend": "file"}, "needs file_path"),
        ({"s3_bucket": "b", "strategy": "yolo"}, "strategy"),
        ({"s3_bucket": "b", "producer": {"linger_ms": -1}}, "producer.linger_ms"),
        ({"s3_bucket": "b", "colour": "blue"}, "colour"),
        (["not", "a", "mapping"], "must be a mapping"),
    ],
)
def test_malformed_config_is_a_clear_error(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_dict(data)  # type: ignore[arg-type]


def test_malformed_yaml_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("s3_bucket: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Settings.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.from_yaml(tmp_path / "missing.yaml")


async def test_unreachable_endpoint_fails_fast_and_clearly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings.from_dict(
        {
            "s3_bucket": "b",
            "s3_endpoint_url": f"http://127.0.0.1:{port}",
            "s3_access_key_id": "k",
            "s3_secret_access_key": "s",
            "s3_connect_timeout_s": 1,
            "s3_max_attempts": 2,
        }
    )
    started = time.monotonic()
    with pytest.raises(StorageError, match=f"127.0.0.1:{port}"):
        async with Bucketq(settings):
            pass
    assert time.monotonic() - started < 30


async def test_csprng_verify_forced_on_a_store_without_conditional_writes() -> None:
    store = MemoryStore(honour_conditions=False)
    backend = Backend(
        "memory",
        {"backend": "memory", "strategy": "auto", "csprng": {"jitter_min_ms": 1, "jitter_max_ms": 3}},
        store,
    )
    bq = await backend.connect()
    assert bq.strategy == "csprng_verify"  # the probe saw no 412
    await bq.create_topic("t", partitions=2)
    producers = [await (await backend.connect()).register_producer(f"p{i}") for i in range(3)]
    results = await asyncio.gather(*(p.publish("t", i) for p in producers for i in range(30)))
    c = await bq.register_consumer("c", "t")
    seen = await drain(c, 90)
    assert set(seen) == {r.id for r in results} and max(seen.values()) == 1
    await backend.close_all()


@pytest.mark.s3
async def test_csprng_verify_forced_on_seaweedfs(seaweedfs_server) -> None:  # type: ignore[no-untyped-def]
    s = seaweedfs_server.settings(strategy="csprng_verify")
    data = s.model_dump(mode="json", exclude_none=True) | {
        "s3_access_key_id": seaweedfs_server.access_key,
        "s3_secret_access_key": seaweedfs_server.secret_key,
        "csprng": {"jitter_min_ms": 5, "jitter_max_ms": 20},
    }
    backend = Backend("seaweedfs", data)
    bq = await backend.connect()
    assert bq.strategy == "csprng_verify"
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    results = await asyncio.gather(*(p.publish("t", i) for i in range(50)))
    c = await bq.register_consumer("c", "t")
    seen = await drain(c, 50)
    assert set(seen) == {r.id for r in results}
    await backend.close_all()


@pytest.mark.s3
@pytest.mark.parametrize("server", ["moto_server", "seaweedfs_server"])
async def test_auto_probe_chooses_conditional_write(server: str, request: pytest.FixtureRequest) -> None:
    srv = request.getfixturevalue(server)
    async with Bucketq(srv.settings(strategy="auto")) as bq:
        assert bq.strategy == "conditional_write"
        assert [i.key async for i in bq.storage.list("_probe/")] == []  # the probe cleans up
