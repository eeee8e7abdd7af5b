"""The injection plan as a pure function: defaults, publish-only pods, validation."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.injection import CONTAINER, InjectionError, already_injected, plan, wants_injection
from bucketq.operator.models import ConsumerSpec

ENGINE = Settings.from_dict(
    {
        "backend": "s3",
        "s3_bucket": "queues",
        "s3_endpoint_url": "http://minio:9000",
        "s3_access_key_id": "AKIAOPERATOR",
        "s3_secret_access_key": "operator-secret",
    }
)


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {"bucketq.io/inject": "true", **annotations}},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "app:1",
                    "env": [{"name": "BUCKETQ_SIDECAR_URL", "value": "http://custom"}],
                }
            ]
        },
    }


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_publish_only_pod_gets_a_sidecar_without_consumer() -> None:
    injection = plan(pod(), None, engine=ENGINE, settings=OperatorSettings())
    sidecar = injection.spec["initContainers"][0]
    values = env(sidecar)
    assert "BUCKETQ_SIDECAR_CONSUMER" not in values and values["BUCKETQ_SIDECAR_DELIVERY"] == "pull"
    assert (
        values["BUCKETQ_ROOT"] == "$(BUCKETQ_POD_NAMESPACE)"
        and values["BUCKETQ_S3_ENDPOINT_URL"] == "http://minio:9000"
    )
    assert "AKIAOPERATOR" not in str(injection) and "operator-secret" not in str(injection)
    assert env(injection.spec["containers"][0])["BUCKETQ_SIDECAR_URL"] == "http://custom", (
        "the app's value stays"
    )
    assert {"name": "bucketq-sidecar-tmp", "emptyDir": {"sizeLimit": "64Mi"}} in injection.spec["volumes"]


def test_operator_defaults_and_pod_identity() -> None:
    settings = OperatorSettings(
        sidecar_native=False, sidecar_s3_endpoint_url="http://s3.internal", sidecar_image="registry/bucketq:2"
    )
    spec = ConsumerSpec(topics=["a", "b"])
    injection = plan(
        pod(
            **{
                "bucketq.io/consumer": "c",
                "bucketq.io/s3-secret": "none",
                "bucketq.io/topics": "b",
                "bucketq.io/log-level": "debug",
            }
        ),
        spec,
        engine=ENGINE,
        settings=settings,
    )
    assert "initContainers" not in injection.spec
    sidecar = injection.spec["containers"][-1]
    assert sidecar["name"] == CONTAINER and sidecar["image"] == "registry/bucketq:2"
    values = env(sidecar)
    assert values["BUCKETQ_SIDECAR_TOPICS"] == "b" and values["BUCKETQ_SIDECAR_LOG_LEVEL"] == "DEBUG"
    assert values["BUCKETQ_S3_ENDPOINT_URL"] == "http://s3.internal"
    assert "BUCKETQ_S3_ACCESS_KEY_ID" not in values, "s3-secret: none relies on the pod's identity"


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"bucketq.io/native-sidecar": "maybe"}, "is not true or false"),
        ({"bucketq.io/consumer": "Bad Name"}, "is not a valid name"),
        ({"bucketq.io/topics": "orders"}, "needs bucketq.io/consumer"),
        ({"bucketq.io/consumer": "c", "bucketq.io/delivery": "push", "bucketq.io/topics": "t"}, "app's port"),
        ({"bucketq.io/app-path": "relative"}, "must start with '/'"),
        ({"bucketq.io/log-level": "LOUD"}, "is not one of"),
        ({"bucketq.io/s3-secret": "Not_Valid"}, "is not a valid name"),
    ],
)
def test_invalid_annotations(annotations: dict[str, str], fragment: str) -> None:
    with pytest.raises(InjectionError, match=fragment):
        plan(pod(**annotations), None, engine=ENGINE, settings=OperatorSettings())


def test_detection() -> None:
    assert wants_injection(pod()) and not wants_injection({"metadata": {}})
    assert not wants_injection({"metadata": {"annotations": {"bucketq.io/inject": "no"}}})
    injected = {"spec": {"initContainers": [{"name": CONTAINER}], "containers": []}}
    assert already_injected(injected) and not already_injected(pod())


def test_the_sidecar_accepts_the_injected_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract with bucketq.sidecar: its config loader takes exactly what the webhook injects."""
    from bucketq.sidecar.config import load_config

    spec = ConsumerSpec.model_validate(
        {"topics": ["orders"], "ordered": True, "delivery": {"mode": "push", "push": {"port": 8080}}}
    )
    engine = ENGINE.model_copy(update={"root": "bucketq"})
    sidecar = plan(
        pod(**{"bucketq.io/consumer": "billing"}), spec, engine=engine, settings=OperatorSettings()
    ).spec["initContainers"][0]
    for name in [k for k in os.environ if k.startswith("BUCKETQ_")]:
        monkeypatch.delenv(name)
    secrets = {"BUCKETQ_S3_ACCESS_KEY_ID": "AKIAPOD", "BUCKETQ_S3_SECRET_ACCESS_KEY": "pod-secret"}
    for item in sidecar["env"]:
        value = item.get("value")
        if value is None:
            value = secrets.get(item["name"], "team-a")  # secretKeyRef / downward API
        monkeypatch.setenv(item["name"], value.replace("$(BUCKETQ_POD_NAMESPACE)", "team-a"))
    config = load_config()
    assert config.engine.root == "bucketq/team-a" and config.engine.s3_bucket == "queues"
    assert config.engine.consumer.ordered is True
    assert config.sidecar.consumer == "billing" and config.sidecar.topics == ["orders"]
    assert config.sidecar.delivery == "push" and config.sidecar.app_port == 8080
    assert config.sidecar.listen_host == "127.0.0.1" and config.sidecar.metrics_port == 9090
