"""The injection plan as a pure function: defaults, publish-only pods, validation."""

from __future__ import annotations

import copy
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


# -- the webhook owns the sidecar (security review "Hardening", finding 6) -----------------------


def injected_pod(**annotations: str) -> dict[str, Any]:
    """A pod as the webhook left it: the original with the plan applied."""
    original = pod(**annotations)
    result = plan(original, None, engine=ENGINE, settings=OperatorSettings())
    original["spec"].update(copy.deepcopy(result.spec))
    original["metadata"]["annotations"].update(result.annotations)
    return original


def test_the_webhooks_own_sidecar_seen_again_is_left_alone() -> None:
    again = injected_pod(**{"bucketq.io/api-token-secret": "api-token"})
    assert plan(again, None, engine=ENGINE, settings=OperatorSettings()).spec == {}
    # What the apiserver adds when it defaults the pod (e.g. re-created from `kubectl get -o yaml`).
    sidecar = again["spec"]["initContainers"][0]
    sidecar["terminationMessagePath"] = "/dev/termination-log"
    sidecar["readinessProbe"]["successThreshold"] = 1
    sidecar["readinessProbe"]["httpGet"]["scheme"] = "HTTP"
    sidecar["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    assert plan(again, None, engine=ENGINE, settings=OperatorSettings()).spec == {}


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    next(e for e in container["env"] if e["name"] == name).update(value=value)


@pytest.mark.parametrize(
    ("tamper", "fragment"),
    [
        (
            lambda s: _set_env(s["initContainers"][0], "BUCKETQ_ROOT", "team-b"),
            "env[BUCKETQ_ROOT].value is 'team-b'",
        ),
        (
            lambda s: _set_env(s["initContainers"][0], "BUCKETQ_S3_BUCKET", "other"),
            "env[BUCKETQ_S3_BUCKET].value is 'other'",
        ),
        (lambda s: s["initContainers"][0].update(args=["--root", "team-b"]), "has args"),
        (
            lambda s: s["initContainers"][0].update(envFrom=[{"configMapRef": {"name": "evil"}}]),
            "has envFrom",
        ),
        (lambda s: s["initContainers"][0].update(image="attacker/bucketq:1"), "image is"),
        (lambda s: s["containers"].append(s["initContainers"].pop(0)), "outside spec.initContainers"),
        (
            lambda s: s["volumes"][-1]["secret"].update(secretName="team-b-token"),
            "volume bucketq-api-token",
        ),
        (
            lambda s: s["containers"][0]["env"].pop(),
            "container app",
        ),
    ],
    ids=["root", "bucket", "args", "envFrom", "image", "position", "token-volume", "app-token"],
)
def test_a_pod_bringing_its_own_sidecar_is_rejected(tamper: Any, fragment: str) -> None:
    """Only the webhook's own sidecar passes: anything else could name another namespace's root."""
    tampered = injected_pod(**{"bucketq.io/api-token-secret": "api-token"})
    tamper(tampered["spec"])
    with pytest.raises(InjectionError, match="declares its own 'bucketq-sidecar'") as info:
        plan(tampered, None, engine=ENGINE, settings=OperatorSettings())
    assert fragment in str(info.value) and "the bucketq webhook injects it" in str(info.value)


def test_a_hand_written_sidecar_in_a_fresh_pod_is_rejected() -> None:
    own = pod()
    own["spec"]["containers"].append(
        {
            "name": CONTAINER,
            "image": "bucketq:test",
            "env": [{"name": "BUCKETQ_ROOT", "value": "team-b"}],
        }
    )
    with pytest.raises(InjectionError, match="declares its own 'bucketq-sidecar'"):
        plan(own, None, engine=ENGINE, settings=OperatorSettings())


@pytest.mark.parametrize(
    ("entry", "allowed"),
    [
        ({"name": "BUCKETQ_ROOT", "value": "team-b"}, False),
        ({"name": "BUCKETQ_ROOT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "root"}}}, False),
        ({"name": "BUCKETQ_ROOT", "value": "$(BUCKETQ_POD_NAMESPACE)"}, True),
        ({"name": "BUCKETQ_ROOT", "value": "team-a"}, True),  # the namespace's own root, spelled out
    ],
)
def test_an_app_container_naming_another_root_is_rejected(entry: dict[str, Any], allowed: bool) -> None:
    for where in ("containers", "initContainers"):
        conflicting = pod()
        conflicting["metadata"]["namespace"] = "team-a"
        conflicting["spec"].setdefault(where, []).insert(0, {"name": "x", "image": "x", "env": [entry]})
        if allowed:
            plan(conflicting, None, engine=ENGINE, settings=OperatorSettings())
        else:
            with pytest.raises(InjectionError, match="container 'x' sets BUCKETQ_ROOT"):
                plan(conflicting, None, engine=ENGINE, settings=OperatorSettings())


def test_host_network_pods_are_refused_unless_allowed_with_a_token() -> None:
    def host(**annotations: str) -> dict[str, Any]:
        p = pod(**annotations)
        p["spec"]["hostNetwork"] = True
        return p

    with pytest.raises(InjectionError, match="hostNetwork: the sidecar would listen on the node's loopback"):
        plan(host(), None, engine=ENGINE, settings=OperatorSettings())
    with pytest.raises(InjectionError, match=r"allow-host-network needs bucketq\.io/api-token-secret"):
        plan(
            host(**{"bucketq.io/allow-host-network": "true"}),
            None,
            engine=ENGINE,
            settings=OperatorSettings(),
        )
    with pytest.raises(InjectionError, match="is not true or false"):
        plan(
            host(**{"bucketq.io/allow-host-network": "sure"}),
            None,
            engine=ENGINE,
            settings=OperatorSettings(),
        )
    with pytest.raises(InjectionError, match="hostNetwork"):
        plan(
            host(**{"bucketq.io/allow-host-network": "false"}),
            None,
            engine=ENGINE,
            settings=OperatorSettings(),
        )
    allowed = plan(
        host(**{"bucketq.io/allow-host-network": "true", "bucketq.io/api-token-secret": "api-token"}),
        None,
        engine=ENGINE,
        settings=OperatorSettings(),
    )
    assert allowed.spec["initContainers"][0]["name"] == CONTAINER
    assert any("hostNetwork pod" in w for w in allowed.warnings)


# -- API and push tokens (finding 7) ------------------------------------------------------------


def test_token_secrets_reach_the_sidecar_and_the_app() -> None:
    spec = ConsumerSpec.model_validate(
        {"topics": ["orders"], "delivery": {"mode": "push", "push": {"port": 8080}}}
    )
    injection = plan(
        pod(
            **{
                "bucketq.io/consumer": "billing",
                "bucketq.io/api-token-secret": "api-token",
                "bucketq.io/push-token-secret": "push-token",
            }
        ),
        spec,
        engine=ENGINE,
        settings=OperatorSettings(),
    )
    sidecar, app = injection.spec["initContainers"][0], injection.spec["containers"][0]
    api = {"secretKeyRef": {"name": "api-token", "key": "token"}}
    push = {"secretKeyRef": {"name": "push-token", "key": "token"}}
    assert env(app)["BUCKETQ_API_TOKEN"] == api and env(app)["BUCKETQ_PUSH_TOKEN"] == push
    assert env(sidecar)["BUCKETQ_SIDECAR_APP_TOKEN"] == push
    assert env(sidecar)["BUCKETQ_SIDECAR_TOKEN_FILE"] == "/var/run/secrets/bucketq.io/api-token/token"
    assert {
        "name": "bucketq-api-token",
        "mountPath": "/var/run/secrets/bucketq.io/api-token",
        "readOnly": True,
    } in (sidecar["volumeMounts"])
    assert {
        "name": "bucketq-api-token",
        "secret": {
            "secretName": "api-token",
            "items": [{"key": "token", "path": "token"}],
            "defaultMode": 0o444,
        },
    } in injection.spec["volumes"]
    assert not any("api-token-secret" in w for w in injection.warnings)


def test_without_a_token_secret_the_api_is_open_to_the_pod_with_a_warning() -> None:
    injection = plan(pod(), None, engine=ENGINE, settings=OperatorSettings())
    sidecar, app = injection.spec["initContainers"][0], injection.spec["containers"][0]
    assert "BUCKETQ_SIDECAR_TOKEN_FILE" not in env(sidecar) and "BUCKETQ_API_TOKEN" not in env(app)
    assert [v["name"] for v in injection.spec["volumes"]] == ["bucketq-sidecar-tmp"]
    assert any("no bucketq.io/api-token-secret" in w for w in injection.warnings)


@pytest.mark.parametrize(
    ("annotations", "app_env", "fragment"),
    [
        ({"bucketq.io/api-token-secret": "Bad_Name"}, [], "is not a valid name"),
        ({"bucketq.io/push-token-secret": "push-token"}, [], "needs push delivery"),
        (
            {"bucketq.io/api-token-secret": "api-token"},
            [{"name": "BUCKETQ_API_TOKEN", "value": "guess"}],
            "sets BUCKETQ_API_TOKEN itself",
        ),
    ],
)
def test_bad_token_wiring_is_rejected(
    annotations: dict[str, str], app_env: list[dict[str, Any]], fragment: str
) -> None:
    bad = pod(**annotations)
    bad["spec"]["containers"][0]["env"] += app_env
    with pytest.raises(InjectionError, match=fragment):
        plan(bad, None, engine=ENGINE, settings=OperatorSettings())


def test_the_sidecar_reads_the_injected_tokens(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The contract: the injected token file and push token are the sidecar's own settings."""
    from bucketq.sidecar.config import load_config

    spec = ConsumerSpec.model_validate(
        {"topics": ["orders"], "delivery": {"mode": "push", "push": {"port": 8080}}}
    )
    annotations = {
        "bucketq.io/consumer": "billing",
        "bucketq.io/api-token-secret": "api-token",
        "bucketq.io/push-token-secret": "push-token",
    }
    sidecar = plan(pod(**annotations), spec, engine=ENGINE, settings=OperatorSettings()).spec[
        "initContainers"
    ][0]
    (tmp_path / "token").write_text("s3cret\n")
    for name in [k for k in os.environ if k.startswith("BUCKETQ_")]:
        monkeypatch.delenv(name)
    secrets = {"push-token": "push-s3cret"}  # secretKeyRefs, as the kubelet resolves them
    for item in sidecar["env"]:
        ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
        value = item.get("value", secrets.get(ref.get("name", ""), "team-a"))
        value = value.replace("/var/run/secrets/bucketq.io/api-token", str(tmp_path))
        monkeypatch.setenv(item["name"], value.replace("$(BUCKETQ_POD_NAMESPACE)", "team-a"))
    config = load_config().sidecar
    assert config.token() == "s3cret" and config.push_token() == "push-s3cret"
