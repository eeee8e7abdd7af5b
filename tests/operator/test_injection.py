"""The injection plan as a pure function: defaults, publish-only pods, validation."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from bucketq.config import PROFILES, Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.injection import (
    CONTAINER,
    InjectionError,
    already_injected,
    consumer_name,
    plan,
    wants_injection,
)
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


POD_IP = "10.1.2.3"


def kubelet_value(item: dict[str, Any], secrets: dict[str, str] | None = None) -> str:
    """An env entry's value as the kubelet gives it to the sidecar of a pod in ``team-a``:
    ``valueFrom`` resolved (the secret's value from ``secrets`` by secret or variable name) and
    ``$(BUCKETQ_POD_NAMESPACE)`` expanded."""
    value = item.get("value")
    if value is None:
        source = item.get("valueFrom") or {}
        field = (source.get("fieldRef") or {}).get("fieldPath")
        ref = (source.get("secretKeyRef") or {}).get("name", "")
        secrets = secrets or {}
        value = {"status.podIP": POD_IP, "metadata.namespace": "team-a"}.get(
            field or "", secrets.get(ref, secrets.get(item["name"], "team-a"))
        )
    return str(value).replace("$(BUCKETQ_POD_NAMESPACE)", "team-a")


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


def meta(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {}, "annotations": annotations or {}}}


@pytest.mark.parametrize(
    ("labels", "annotations", "wanted"),
    [
        ({"bucketq.io/consumer": "billing"}, {}, True),  # the consumer label alone is enough
        ({"bucketq.io/inject": "true"}, {}, True),
        ({"bucketq.io/consumer": "billing", "bucketq.io/inject": "false"}, {}, False),
        ({"bucketq.io/consumer": "billing"}, {"bucketq.io/inject": "false"}, False),
        ({"bucketq.io/consumer": " "}, {}, False),
        ({"app": "w"}, {"bucketq.io/consumer": "billing"}, False),  # an annotation selects nothing
    ],
)
def test_injection_by_label(labels: dict[str, str], annotations: dict[str, str], wanted: bool) -> None:
    assert wants_injection(meta(labels, annotations)) is wanted


def test_an_inject_value_that_is_no_boolean_is_an_error() -> None:
    with pytest.raises(InjectionError, match=r"label bucketq\.io/inject: 'maybe' is not true or false"):
        wants_injection(meta({"bucketq.io/consumer": "billing", "bucketq.io/inject": "maybe"}))


def test_the_consumer_comes_from_the_label_or_the_annotation() -> None:
    assert consumer_name(meta({"bucketq.io/consumer": "billing"})) == "billing"
    assert consumer_name(meta({}, {"bucketq.io/consumer": "billing"})) == "billing"
    both = meta({"bucketq.io/consumer": "billing"}, {"bucketq.io/consumer": "billing"})
    assert consumer_name(both) == "billing"
    assert consumer_name(meta({"bucketq.io/inject": "true"})) is None
    with pytest.raises(InjectionError, match=r"label bucketq\.io/consumer is 'billing' but annotation"):
        consumer_name(meta({"bucketq.io/consumer": "billing"}, {"bucketq.io/consumer": "refunds"}))
    with pytest.raises(InjectionError, match=r"label bucketq\.io/consumer: 'Billing' is not a valid name"):
        consumer_name(meta({"bucketq.io/consumer": "Billing"}))


def test_a_labelled_pod_is_injected_from_its_consumer() -> None:
    labelled = pod()
    del labelled["metadata"]["annotations"]["bucketq.io/inject"]
    labelled["metadata"]["labels"] = {"bucketq.io/consumer": "billing"}
    spec = ConsumerSpec(topics=["orders"])
    injection = plan(labelled, spec, engine=ENGINE, settings=OperatorSettings())
    values = env(injection.spec["initContainers"][0])
    assert values["BUCKETQ_SIDECAR_CONSUMER"] == "billing" and values["BUCKETQ_SIDECAR_TOPICS"] == "orders"
    # one label on every injected pod, whichever label asked for the sidecar (the PodMonitor's)
    assert injection.labels == {"bucketq.io/injected": "true"}


# -- ports -----------------------------------------------------------------------------------------


def probe_ports(sidecar: dict[str, Any]) -> set[Any]:
    return {sidecar[p]["httpGet"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")}


def test_default_ports_stay_clear_of_other_meshes() -> None:
    app = pod()
    app["spec"]["containers"][0]["env"] = []
    injection = plan(app, None, engine=ENGINE, settings=OperatorSettings())
    sidecar = injection.spec["initContainers"][0]
    values = env(sidecar)
    assert (
        values["BUCKETQ_SIDECAR_LISTEN_PORT"] == "3580" and values["BUCKETQ_SIDECAR_METRICS_PORT"] == "9580"
    )
    assert probe_ports(sidecar) == {9580} and sidecar["ports"][0]["containerPort"] == 9580
    assert injection.annotations["prometheus.io/port"] == "9580"
    assert env(injection.spec["containers"][0])["BUCKETQ_SIDECAR_URL"] == "http://127.0.0.1:3580"


def test_ports_from_annotations() -> None:
    app = pod(**{"bucketq.io/api-port": "4580", "bucketq.io/metrics-port": "9581"})
    app["spec"]["containers"][0]["env"] = []
    injection = plan(app, None, engine=ENGINE, settings=OperatorSettings())
    sidecar = injection.spec["initContainers"][0]
    values = env(sidecar)
    assert (
        values["BUCKETQ_SIDECAR_LISTEN_PORT"] == "4580" and values["BUCKETQ_SIDECAR_METRICS_PORT"] == "9581"
    )
    assert probe_ports(sidecar) == {9581} and sidecar["ports"][0]["containerPort"] == 9581
    assert injection.annotations["prometheus.io/port"] == "9581"
    assert env(injection.spec["containers"][0])["BUCKETQ_SIDECAR_URL"] == "http://127.0.0.1:4580"
    # the operator's defaults move the same way
    moved = plan(pod(), None, engine=ENGINE, settings=OperatorSettings(sidecar_metrics_port=9700))
    assert moved.annotations["prometheus.io/port"] == "9700"


@pytest.mark.parametrize(
    ("annotations", "app_ports", "fragment"),
    [
        ({"bucketq.io/api-port": "http"}, [], "annotation bucketq.io/api-port: 'http' is not a port number"),
        (
            {"bucketq.io/metrics-port": "0"},
            [],
            "annotation bucketq.io/metrics-port: '0' is not a port number",
        ),
        ({"bucketq.io/api-port": "70000"}, [], "is not a port number (1-65535)"),
        ({"bucketq.io/api-port": "9580"}, [], "both use port 9580"),
        ({}, [9580], "container 'app' declares port 9580, the sidecar's metrics port"),
        (
            {"bucketq.io/api-port": "8080"},
            [8080],
            "container 'app' declares port 8080, the sidecar's API port",
        ),
        (
            {"bucketq.io/consumer": "c", "bucketq.io/delivery": "push", "bucketq.io/app-port": "3580"},
            [],
            "the push target port 3580 is a port of the sidecar itself",
        ),
    ],
)
def test_bad_ports_are_rejected(annotations: dict[str, str], app_ports: list[int], fragment: str) -> None:
    bad = pod(**{"bucketq.io/consumer": "c", **annotations})
    bad["spec"]["containers"][0]["ports"] = [{"containerPort": p} for p in app_ports]
    with pytest.raises(InjectionError) as info:
        plan(bad, ConsumerSpec(topics=["t"]), engine=ENGINE, settings=OperatorSettings())
    assert fragment in str(info.value)


def test_operator_settings_refuse_one_port_for_both() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="the sidecar needs two ports"):
        OperatorSettings(sidecar_api_port=9000, sidecar_metrics_port=9000)


# -- shutdown --------------------------------------------------------------------------------------


def graceful(grace: int | None, **annotations: str) -> dict[str, Any]:
    p = pod(**annotations)
    if grace is not None:
        p["spec"]["terminationGracePeriodSeconds"] = grace
    return p


@pytest.mark.parametrize(
    ("grace", "annotations", "set_to", "budget"),
    [
        (None, {}, None, "25"),  # Kubernetes' default of 30 s
        (30, {}, None, "25"),  # as the apiserver defaults it
        (60, {}, None, "55"),  # the pod's own
        (4, {}, None, "1"),  # never below one second
        (30, {"bucketq.io/termination-grace-seconds": "120"}, 120, "115"),
        (None, {"bucketq.io/termination-grace-seconds": "45"}, 45, "40"),
    ],
)
def test_the_shutdown_budget_follows_the_effective_grace_period(
    grace: int | None, annotations: dict[str, str], set_to: int | None, budget: str
) -> None:
    injection = plan(graceful(grace, **annotations), None, engine=ENGINE, settings=OperatorSettings())
    assert env(injection.spec["initContainers"][0])["BUCKETQ_SIDECAR_SHUTDOWN_BUDGET_S"] == budget
    assert injection.spec.get("terminationGracePeriodSeconds") == set_to
    assert not any("replaces the pod's terminationGracePeriodSeconds" in w for w in injection.warnings)


def test_the_grace_annotation_overriding_the_pods_own_value_warns() -> None:
    injection = plan(
        graceful(60, **{"bucketq.io/termination-grace-seconds": "90"}),
        None,
        engine=ENGINE,
        settings=OperatorSettings(),
    )
    assert injection.spec["terminationGracePeriodSeconds"] == 90
    assert any(
        "bucketq.io/termination-grace-seconds (90) replaces the pod's terminationGracePeriodSeconds (60)" in w
        for w in injection.warnings
    )


def test_drain_grace_annotation() -> None:
    injection = plan(
        graceful(60, **{"bucketq.io/drain-grace-seconds": "12.5"}),
        None,
        engine=ENGINE,
        settings=OperatorSettings(),
    )
    values = env(injection.spec["initContainers"][0])
    assert values["BUCKETQ_SIDECAR_DRAIN_GRACE_S"] == "12.5"
    assert values["BUCKETQ_SIDECAR_SHUTDOWN_BUDGET_S"] == "55"
    assert not any("drain" in w for w in injection.warnings)
    assert "BUCKETQ_SIDECAR_DRAIN_GRACE_S" not in env(
        plan(pod(), None, engine=ENGINE, settings=OperatorSettings()).spec["initContainers"][0]
    ), "without the annotation the sidecar's own default applies"
    long = plan(
        graceful(30, **{"bucketq.io/drain-grace-seconds": "40"}),
        None,
        engine=ENGINE,
        settings=OperatorSettings(),
    )
    assert any(
        "bucketq.io/drain-grace-seconds (40) is longer than the sidecar's shutdown budget (25 s" in w
        for w in long.warnings
    )


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"bucketq.io/termination-grace-seconds": "soon"}, "'soon' is not a number of seconds (1-86400)"),
        ({"bucketq.io/termination-grace-seconds": "0"}, "'0' is not a number of seconds"),
        ({"bucketq.io/termination-grace-seconds": "1.5"}, "'1.5' is not a number of seconds"),
        ({"bucketq.io/drain-grace-seconds": "-1"}, "drain-grace-seconds: '-1' is not a number of seconds"),
        ({"bucketq.io/drain-grace-seconds": "nan"}, "drain-grace-seconds: 'nan' is not a number of seconds"),
        ({"bucketq.io/drain-grace-seconds": "a while"}, "'a while' is not a number of seconds"),
    ],
)
def test_bad_shutdown_annotations_are_rejected(annotations: dict[str, str], fragment: str) -> None:
    with pytest.raises(InjectionError) as info:
        plan(pod(**annotations), None, engine=ENGINE, settings=OperatorSettings())
    assert fragment in str(info.value)


def test_the_sidecar_reads_the_shutdown_retry_and_batch_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract with bucketq.sidecar: the budget, the push backoff and the batch size it is given."""
    from bucketq.sidecar.config import load_config

    spec = ConsumerSpec.model_validate(
        {
            "topics": ["orders"],
            "delivery": {
                "mode": "push",
                "push": {
                    "port": 8080,
                    "batchSize": 20,
                    "format": "cloudevents-structured",
                    "retry": {"initialSeconds": 0.5, "maxSeconds": 30, "multiplier": 3},
                },
            },
        }
    )
    annotations = {"bucketq.io/consumer": "billing", "bucketq.io/drain-grace-seconds": "10"}
    sidecar = plan(graceful(45, **annotations), spec, engine=ENGINE, settings=OperatorSettings()).spec[
        "initContainers"
    ][0]
    values = env(sidecar)
    assert values["BUCKETQ_SIDECAR_PUSH_BATCH_SIZE"] == "20"
    assert values["BUCKETQ_SIDECAR_PUSH_FORMAT"] == "cloudevents-structured"
    assert values["BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S"] == "0.5"
    assert values["BUCKETQ_SIDECAR_PUSH_RETRY_MAX_S"] == "30"
    assert values["BUCKETQ_SIDECAR_PUSH_RETRY_MULTIPLIER"] == "3"
    for name in [k for k in os.environ if k.startswith("BUCKETQ_")]:
        monkeypatch.delenv(name)
    for item in sidecar["env"]:
        monkeypatch.setenv(item["name"], kubelet_value(item))
    config = load_config().sidecar
    assert config.push_batch_size == 20
    assert config.push_format == "cloudevents-structured"
    assert (config.push_retry_initial_s, config.push_retry_max_s, config.push_retry_multiplier) == (
        0.5,
        30,
        3,
    )
    assert config.shutdown_budget_s == 40 and config.drain_grace_s == 10


@pytest.mark.parametrize(
    ("consumer_profile", "annotation", "wanted"),
    [("balanced", None, "balanced"), ("economy", None, "economy"), ("economy", "latency", "latency")],
)
def test_the_profile_comes_from_the_consumer_or_the_pod(
    monkeypatch: pytest.MonkeyPatch, consumer_profile: str, annotation: str | None, wanted: str
) -> None:
    """The Consumer's latency/cost profile reaches the sidecar's engine settings; a pod's
    annotation overrides it (config.PROFILES sets the lingers and cadences)."""
    from bucketq.sidecar.config import load_config

    spec = ConsumerSpec.model_validate({"topics": ["orders"], "profile": consumer_profile})
    annotations = {"bucketq.io/consumer": "billing"}
    if annotation is not None:
        annotations["bucketq.io/profile"] = annotation
    sidecar = plan(graceful(45, **annotations), spec, engine=ENGINE, settings=OperatorSettings()).spec[
        "initContainers"
    ][0]
    assert env(sidecar)["BUCKETQ_PROFILE"] == wanted
    for name in [k for k in os.environ if k.startswith("BUCKETQ_")]:
        monkeypatch.delenv(name)
    for item in sidecar["env"]:
        monkeypatch.setenv(item["name"], kubelet_value(item))
    engine = load_config().engine
    assert engine.profile == wanted
    assert engine.producer.linger_ms == PROFILES[wanted]["producer"]["linger_ms"]


def test_an_unknown_profile_annotation_is_refused() -> None:
    spec = ConsumerSpec.model_validate({"topics": ["orders"]})
    with pytest.raises(InjectionError, match=r"bucketq\.io/profile"):
        plan(
            graceful(45, **{"bucketq.io/consumer": "billing", "bucketq.io/profile": "fastest"}),
            spec,
            engine=ENGINE,
            settings=OperatorSettings(),
        )


# -- tokens ----------------------------------------------------------------------------------------


def test_token_secret_is_the_api_token_secret() -> None:
    short = plan(
        pod(**{"bucketq.io/token-secret": "api-token"}), None, engine=ENGINE, settings=OperatorSettings()
    )
    long = plan(
        pod(**{"bucketq.io/api-token-secret": "api-token"}), None, engine=ENGINE, settings=OperatorSettings()
    )
    assert short.spec == long.spec
    assert env(short.spec["containers"][0])["BUCKETQ_API_TOKEN"] == {
        "secretKeyRef": {"name": "api-token", "key": "token"}
    }
    both = pod(**{"bucketq.io/token-secret": "api-token", "bucketq.io/api-token-secret": "api-token"})
    assert plan(both, None, engine=ENGINE, settings=OperatorSettings()).spec == short.spec
    with pytest.raises(InjectionError, match="name two API token Secrets"):
        plan(
            pod(**{"bucketq.io/token-secret": "a", "bucketq.io/api-token-secret": "b"}),
            None,
            engine=ENGINE,
            settings=OperatorSettings(),
        )
    with pytest.raises(
        InjectionError, match=r"annotation bucketq\.io/token-secret: 'No' is not a valid name"
    ):
        plan(pod(**{"bucketq.io/token-secret": "No"}), None, engine=ENGINE, settings=OperatorSettings())


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
        monkeypatch.setenv(item["name"], kubelet_value(item, secrets))
    config = load_config()
    assert config.engine.root == "bucketq/team-a" and config.engine.s3_bucket == "queues"
    assert config.engine.consumer.ordered is True
    assert config.sidecar.consumer == "billing" and config.sidecar.topics == ["orders"]
    assert config.sidecar.delivery == "push" and config.sidecar.app_port == 8080
    assert config.sidecar.listen_host == "127.0.0.1" and config.sidecar.listen_port == 3580
    assert config.sidecar.metrics_port == 9580
    assert config.engine.ping.enabled and config.engine.ping.advertise_host == POD_IP
    assert config.engine.ping.listen_port == 7470


def test_the_sidecar_is_pinged_on_its_pod_ip_at_a_fixed_udp_port() -> None:
    sidecar = plan(pod(), None, engine=ENGINE, settings=OperatorSettings()).spec["initContainers"][0]
    values = env(sidecar)
    assert values["BUCKETQ_PING__ADVERTISE_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert values["BUCKETQ_PING__LISTEN_PORT"] == "7470"
    assert {"name": "bq-wake", "containerPort": 7470, "protocol": "UDP"} in sidecar["ports"]
    off = plan(pod(), None, engine=ENGINE, settings=OperatorSettings(sidecar_wake_port=0))
    sidecar = off.spec["initContainers"][0]
    assert env(sidecar)["BUCKETQ_PING__ENABLED"] == "false" and "BUCKETQ_PING__ADVERTISE_HOST" not in env(
        sidecar
    )
    assert all(p["protocol"] == "TCP" for p in sidecar["ports"])


def test_an_app_container_on_the_wake_port_is_refused() -> None:
    p = pod()
    p["spec"]["containers"][0]["ports"] = [{"containerPort": 7470, "protocol": "UDP"}]
    with pytest.raises(InjectionError, match="wake-ping port"):
        plan(p, None, engine=ENGINE, settings=OperatorSettings())
    p["spec"]["containers"][0]["ports"] = [{"containerPort": 7470}]  # TCP: no clash
    plan(p, None, engine=ENGINE, settings=OperatorSettings())
    with pytest.raises(ValueError, match="sidecar_wake_port"):
        OperatorSettings(sidecar_wake_port=9580)


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
    with pytest.raises(InjectionError, match=r"allow-host-network needs bucketq\.io/token-secret"):
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
    assert any("no bucketq.io/token-secret" in w for w in injection.warnings)


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
        value = kubelet_value(item, secrets)
        monkeypatch.setenv(
            item["name"], value.replace("/var/run/secrets/bucketq.io/api-token", str(tmp_path))
        )
    config = load_config().sidecar
    assert config.token() == "s3cret" and config.push_token() == "push-s3cret"
