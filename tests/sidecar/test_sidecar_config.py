"""Sidecar configuration: YAML file, ``BUCKETQ_SIDECAR_*``/``BUCKETQ_*`` env and overrides, in that order."""

from __future__ import annotations

from pathlib import Path

import pytest

from bucketq.client._common import URL_ENV, default_url
from bucketq.errors import ConfigError
from bucketq.sidecar.config import load_config

YAML = """
consumer: billing
topics: [orders, refunds]
delivery: push
app_port: 8080
visibility_timeout_s: 12
engine:
  s3_bucket: from-file
  s3_endpoint_url: http://minio:9000
  producer:
    linger_ms: 7
    max_batch_messages: 500
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("BUCKETQ_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_yaml_env_and_overrides(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(YAML)
    clean_env.setenv("BUCKETQ_SIDECAR_CONFIG", str(path))
    clean_env.setenv("BUCKETQ_SIDECAR_APP_PORT", "9000")  # env beats the file
    clean_env.setenv("BUCKETQ_PRODUCER__LINGER_MS", "3")  # nested engine env beats the file
    cfg = load_config(overrides={"listen_port": 3999, "delivery": None})
    sc, engine = cfg.sidecar, cfg.engine
    assert (sc.consumer, sc.topics, sc.delivery) == ("billing", ["orders", "refunds"], "push")
    assert (sc.app_port, sc.listen_port, sc.listen_host, sc.visibility_timeout_s) == (
        9000,
        3999,
        "127.0.0.1",
        12,
    )
    assert sc.app_url == "http://127.0.0.1:9000/bucketq"
    assert (engine.s3_bucket, engine.s3_endpoint_url) == ("from-file", "http://minio:9000")
    assert (engine.producer.linger_ms, engine.producer.max_batch_messages) == (3, 500)


def test_env_only_with_comma_separated_topics(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    clean_env.setenv("BUCKETQ_SIDECAR_CONSUMER", "c")
    clean_env.setenv("BUCKETQ_SIDECAR_TOPICS", "a, b")
    clean_env.setenv("BUCKETQ_SIDECAR_LOG_LEVEL", "debug")
    cfg = load_config()
    assert cfg.sidecar.topics == ["a", "b"] and cfg.sidecar.log_level == "DEBUG"
    assert (cfg.sidecar.listen_host, cfg.sidecar.listen_port, cfg.sidecar.delivery) == (
        "127.0.0.1",
        3580,
        "pull",
    )


def test_default_ports_avoid_other_meshes_and_match_the_client(clean_env: pytest.MonkeyPatch) -> None:
    """3580/9580: Dapr's sidecar takes 3500 (API) and 9090 (metrics), Istio's 15000-15090."""
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    sc = load_config().sidecar
    assert (sc.listen_port, sc.metrics_port) == (3580, 9580)
    clean_env.delenv(URL_ENV, raising=False)
    assert default_url() == f"http://127.0.0.1:{sc.listen_port}"
    clean_env.setenv(URL_ENV, "http://127.0.0.1:4000/")
    assert default_url() == "http://127.0.0.1:4000"


def test_metrics_and_probes_listen_on_loopback_outside_a_pod(clean_env: pytest.MonkeyPatch) -> None:
    """A local sidecar shows its metrics and probes to its own host only; in a pod (the kubelet sets
    KUBERNETES_SERVICE_HOST) the kubelet and Prometheus reach them on the pod IP; configured wins."""
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    clean_env.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert load_config().sidecar.metrics_host == "127.0.0.1"
    clean_env.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert load_config().sidecar.metrics_host == "0.0.0.0"
    clean_env.setenv("BUCKETQ_SIDECAR_METRICS_HOST", "127.0.0.1")
    assert load_config().sidecar.metrics_host == "127.0.0.1"
    clean_env.delenv("KUBERNETES_SERVICE_HOST")
    clean_env.setenv("BUCKETQ_SIDECAR_METRICS_HOST", "0.0.0.0")
    assert load_config().sidecar.metrics_host == "0.0.0.0"


def test_push_retry_and_shutdown_defaults(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    sc = load_config().sidecar
    assert (sc.push_retry_initial_s, sc.push_retry_max_s, sc.push_retry_multiplier) == (1.0, 60.0, 2.0)
    assert (sc.shutdown_budget_s, sc.drain_grace_s) == (25.0, 25.0)
    assert sc.deprecations == []


def test_deprecated_retry_delay_is_an_alias_of_the_initial_delay(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    clean_env.setenv("BUCKETQ_SIDECAR_PUSH_RETRY_DELAY_S", "0.25")
    sc = load_config().sidecar
    assert (sc.push_retry_initial_s, sc.push_retry_max_s) == (0.25, 60.0)
    (warning,) = sc.deprecations
    assert "PUSH_RETRY_DELAY_S is deprecated" in warning and "PUSH_RETRY_INITIAL_S" in warning

    # an old fixed delay above the default cap raises the cap: the delay stays what it was
    clean_env.setenv("BUCKETQ_SIDECAR_PUSH_RETRY_DELAY_S", "120")
    sc = load_config().sidecar
    assert (sc.push_retry_initial_s, sc.push_retry_max_s) == (120.0, 120.0)

    # both given and equal: accepted (with the warning); the new name is the one to keep
    clean_env.setenv("BUCKETQ_SIDECAR_PUSH_RETRY_DELAY_S", "30")
    clean_env.setenv("BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S", "30")
    sc = load_config().sidecar
    assert (sc.push_retry_initial_s, len(sc.deprecations)) == (30.0, 1)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        (
            {"BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S": "10", "BUCKETQ_SIDECAR_PUSH_RETRY_MAX_S": "5"},
            r"BUCKETQ_SIDECAR_PUSH_RETRY_MAX_S \(5\) must be at least BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S \(10\)",
        ),
        (
            {"BUCKETQ_SIDECAR_PUSH_RETRY_DELAY_S": "2", "BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S": "3"},
            r"PUSH_RETRY_DELAY_S \(2\) is a deprecated alias of BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S \(3\)",
        ),
        (
            {"BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S": "0"},
            "push_retry_initial_s: Input should be greater than 0",
        ),
        ({"BUCKETQ_SIDECAR_PUSH_RETRY_DELAY_S": "0"}, "push_retry_delay_s: Input should be greater than 0"),
        ({"BUCKETQ_SIDECAR_PUSH_RETRY_MULTIPLIER": "0.5"}, "push_retry_multiplier: Input should be greater"),
        ({"BUCKETQ_SIDECAR_PUSH_RETRY_MAX_S": "1e9"}, "push_retry_max_s: Input should be less"),
        ({"BUCKETQ_SIDECAR_SHUTDOWN_BUDGET_S": "0"}, "shutdown_budget_s: Input should be greater than 0"),
        ({"BUCKETQ_SIDECAR_SHUTDOWN_BUDGET_S": "soon"}, "shutdown_budget_s: Input should be a valid number"),
    ],
)
def test_invalid_retry_and_budget_settings_are_named(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], problem: str
) -> None:
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=problem):
        load_config()


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"BUCKETQ_SIDECAR_CONSUMER": "c"}, "needs topics"),
        ({"BUCKETQ_SIDECAR_TOPICS": "t"}, "need a consumer"),
        (
            {
                "BUCKETQ_SIDECAR_CONSUMER": "c",
                "BUCKETQ_SIDECAR_TOPICS": "t",
                "BUCKETQ_SIDECAR_DELIVERY": "push",
            },
            "app's port",
        ),
        ({"BUCKETQ_SIDECAR_DELIVERY": "carrier-pigeon"}, "delivery"),
        ({"BUCKETQ_SIDECAR_LISTEN_PORT": "99999"}, "listen_port"),
        ({"BUCKETQ_SIDECAR_CONSUMER": "Bad_Name", "BUCKETQ_SIDECAR_TOPICS": "t"}, "invalid consumer name"),
        ({"BUCKETQ_SIDECAR_CONSUMER": "c", "BUCKETQ_SIDECAR_TOPICS": "ok,no way"}, "invalid topic name"),
        ({"BUCKETQ_SIDECAR_COLOUR": "red"}, None),  # unknown env vars are ignored, like the engine's
    ],
)
def test_invalid_settings_are_named(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], problem: str | None
) -> None:
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    for name, value in env.items():
        clean_env.setenv(name, value)
    if problem is None:
        load_config()
        return
    with pytest.raises(ConfigError, match=problem):
        load_config()


def test_bad_files(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("BUCKETQ_S3_BUCKET", "q")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("consumer: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("colour: red\n")
    with pytest.raises(ConfigError, match="colour"):
        load_config(wrong)
    token = tmp_path / "token"
    token.write_text("")
    empty = tmp_path / "empty-token.yaml"
    empty.write_text(f"token_file: {token}\n")
    with pytest.raises(ConfigError, match="empty"):
        load_config(empty).sidecar.token()
