"""Sidecar injection as a pure function: a pod (and its Consumer) in, the mutated pod spec parts out.

Annotations on the pod (all optional except ``bucketq.io/inject``)::

    bucketq.io/inject: "true"            inject the sidecar
    bucketq.io/consumer: billing         the Consumer (group) this pod belongs to
    bucketq.io/topics: orders,refunds    topics (default: the Consumer's)
    bucketq.io/delivery: pull|push       default: the Consumer's delivery mode
    bucketq.io/app-port: "8080"          push target port (default: the Consumer's push port)
    bucketq.io/app-path: /bucketq        push target path
    bucketq.io/s3-secret: name|none      Secret with accessKeyId/secretAccessKey ("none": pod identity)
    bucketq.io/native-sidecar: "false"   a regular container instead of a native sidecar
    bucketq.io/sidecar-cpu-request, -cpu-limit, -memory-request, -memory-limit: resource overrides
    bucketq.io/log-level: DEBUG|INFO|... the sidecar's log level
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.models import NAME_MAX, NAME_PATTERN, ConsumerSpec

PREFIX = "bucketq.io/"
INJECT = PREFIX + "inject"
CONSUMER = PREFIX + "consumer"
TOPICS = PREFIX + "topics"
DELIVERY = PREFIX + "delivery"
APP_PORT = PREFIX + "app-port"
APP_PATH = PREFIX + "app-path"
SECRET = PREFIX + "s3-secret"
NATIVE = PREFIX + "native-sidecar"
LOG_LEVEL = PREFIX + "log-level"
INJECTED = PREFIX + "injected"
RESOURCES = {
    PREFIX + "sidecar-cpu-request": ("requests", "cpu"),
    PREFIX + "sidecar-memory-request": ("requests", "memory"),
    PREFIX + "sidecar-cpu-limit": ("limits", "cpu"),
    PREFIX + "sidecar-memory-limit": ("limits", "memory"),
}

CONTAINER = "bucketq-sidecar"
TMP_VOLUME = "bucketq-sidecar-tmp"
URL_ENV = "BUCKETQ_SIDECAR_URL"
NAMESPACE_ENV = "BUCKETQ_POD_NAMESPACE"

_TRUE = {"true", "yes", "1", "on", "enabled"}
_FALSE = {"false", "no", "0", "off", "disabled"}
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[mkMGTPE]i?|Ki|[numk])?$")
_NAME = re.compile(NAME_PATTERN)
_LOG_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


class InjectionError(ValueError):
    """The pod cannot get a working sidecar (the message says what to fix)."""


@dataclass(slots=True)
class Injection:
    """The pod spec parts to replace and the annotations to add."""

    spec: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def wants_injection(pod: Mapping[str, Any]) -> bool:
    """The pod asks for the sidecar with the ``bucketq.io/inject`` annotation or label."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return any(
        str(v).strip().lower() in _TRUE for v in (annotations_of(pod).get(INJECT, ""), labels.get(INJECT, ""))
    )


def already_injected(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    names = {c.get("name") for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]}
    return CONTAINER in names


def consumer_name(pod: Mapping[str, Any]) -> str | None:
    value = annotations_of(pod).get(CONSUMER, "").strip()
    if not value:
        return None
    _check_name(value, f"annotation {CONSUMER}")
    return value


def _check_name(value: str, where: str) -> None:
    if len(value) > NAME_MAX or not _NAME.match(value):
        raise InjectionError(
            f"{where}: {value!r} is not a valid name (lower-case letters, digits, '-' and '.', at most {NAME_MAX})"
        )


def _flag(annotations: Mapping[str, str], key: str, default: bool) -> bool:
    value = annotations.get(key)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise InjectionError(f"annotation {key}: {value!r} is not true or false")


@dataclass(frozen=True, slots=True)
class Wiring:
    """What the sidecar serves, resolved from annotations, the Consumer and defaults."""

    consumer: str | None
    topics: list[str]
    delivery: str
    app_port: int | None
    app_path: str | None
    consumer_spec: ConsumerSpec | None


def resolve(annotations: Mapping[str, str], name: str | None, spec: ConsumerSpec | None) -> Wiring:
    """Annotations win over the Consumer, which wins over defaults. Raises InjectionError."""
    topics: list[str] = []
    if TOPICS in annotations:
        topics = [t.strip() for t in annotations[TOPICS].split(",") if t.strip()]
        for topic in topics:
            _check_name(topic, f"annotation {TOPICS}")
        if spec is not None and not set(topics) <= set(spec.topics):
            extra = sorted(set(topics) - set(spec.topics))
            raise InjectionError(
                f"annotation {TOPICS} lists {', '.join(extra)}, which Consumer {name!r} does not subscribe to "
                f"(its topics: {', '.join(spec.topics)})"
            )
    elif spec is not None:
        topics = list(spec.topics)
    if name is None and topics:
        raise InjectionError(f"annotation {TOPICS} needs {CONSUMER} (the consumer group to consume as)")
    delivery = annotations.get(DELIVERY, spec.delivery.mode if spec else "pull").strip().lower()
    if delivery not in ("pull", "push"):
        raise InjectionError(f"annotation {DELIVERY}: {delivery!r} is not pull or push")
    push = spec.delivery.push if spec else None
    port: int | None = push.port if push else None
    if APP_PORT in annotations:
        try:
            port = int(annotations[APP_PORT])
        except ValueError:
            port = 0
        if not 1 <= port <= 65535:
            raise InjectionError(f"annotation {APP_PORT}: {annotations[APP_PORT]!r} is not a port number")
    path = annotations.get(APP_PATH) or (push.path if push else None)
    if path is not None and not path.startswith("/"):
        raise InjectionError(f"annotation {APP_PATH}: {path!r} must start with '/'")
    if delivery == "push":
        if name is None or not topics:
            raise InjectionError(f"push delivery needs {CONSUMER} and topics (annotation or Consumer)")
        if port is None:
            raise InjectionError(
                f"push delivery needs the app's port: annotation {APP_PORT} or the Consumer's "
                "spec.delivery.push.port"
            )
    return Wiring(name if topics else None, topics, delivery, port, path, spec)


def sidecar_env(
    wiring: Wiring, annotations: Mapping[str, str], engine: Settings, settings: OperatorSettings
) -> list[dict[str, Any]]:
    """Environment of the sidecar: engine settings (no secrets in clear), then its own settings."""
    env: list[dict[str, Any]] = [
        {"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "BUCKETQ_BACKEND", "value": "s3"},
        {"name": "BUCKETQ_S3_BUCKET", "value": engine.s3_bucket or ""},
        {"name": "BUCKETQ_S3_REGION", "value": engine.s3_region},
        {"name": "BUCKETQ_S3_PATH_STYLE", "value": str(engine.s3_path_style).lower()},
        {"name": "BUCKETQ_STRATEGY", "value": engine.strategy},
        {
            "name": "BUCKETQ_ROOT",
            "value": f"{engine.root}/$({NAMESPACE_ENV})" if engine.root else f"$({NAMESPACE_ENV})",
        },
    ]
    endpoint = settings.sidecar_s3_endpoint_url or engine.s3_endpoint_url
    if endpoint:
        env.append({"name": "BUCKETQ_S3_ENDPOINT_URL", "value": endpoint})
    secret = annotations.get(SECRET, settings.sidecar_secret).strip()
    if secret and secret.lower() != "none":
        _check_name(secret, f"annotation {SECRET}")
        for var, key in (
            ("BUCKETQ_S3_ACCESS_KEY_ID", settings.sidecar_secret_access_key_id_key),
            ("BUCKETQ_S3_SECRET_ACCESS_KEY", settings.sidecar_secret_secret_access_key_key),
        ):
            env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    own: dict[str, Any] = {
        "LISTEN_HOST": "127.0.0.1",
        "LISTEN_PORT": settings.sidecar_api_port,
        "METRICS_HOST": "0.0.0.0",
        "METRICS_PORT": settings.sidecar_metrics_port,
        "DELIVERY": wiring.delivery,
        "CONSUMER": wiring.consumer,
        "TOPICS": ",".join(wiring.topics) if wiring.topics else None,
        "APP_PORT": wiring.app_port,
        "APP_PATH": wiring.app_path,
    }
    spec = wiring.consumer_spec
    if spec is not None and wiring.consumer is not None:
        own.update(
            START_POSITION=spec.start_position,
            VISIBILITY_TIMEOUT_S=spec.visibility_timeout_seconds,
            MAX_IN_FLIGHT=spec.max_in_flight,
        )
        if spec.delivery.push is not None:
            own.update(
                PUSH_CONCURRENCY=spec.delivery.push.concurrency,
                PUSH_TIMEOUT_S=spec.delivery.push.timeout_seconds,
            )
    if LOG_LEVEL in annotations:
        level = annotations[LOG_LEVEL].strip().upper()
        if level not in _LOG_LEVELS:
            raise InjectionError(
                f"annotation {LOG_LEVEL}: {level!r} is not one of {', '.join(sorted(_LOG_LEVELS))}"
            )
        own["LOG_LEVEL"] = level
    env += [{"name": f"BUCKETQ_SIDECAR_{k}", "value": str(v)} for k, v in own.items() if v is not None]
    if spec is not None and spec.ordered and wiring.consumer is not None:
        env.append({"name": "BUCKETQ_CONSUMER__ORDERED", "value": "true"})
    return env


def sidecar_resources(annotations: Mapping[str, str], settings: OperatorSettings) -> dict[str, Any]:
    resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    defaults = {
        ("requests", "cpu"): settings.sidecar_cpu_request,
        ("requests", "memory"): settings.sidecar_memory_request,
        ("limits", "cpu"): settings.sidecar_cpu_limit,
        ("limits", "memory"): settings.sidecar_memory_limit,
    }
    for key, (section, resource) in RESOURCES.items():
        value = annotations.get(key, defaults[(section, resource)])
        if value is None or value == "":
            continue
        if not _QUANTITY.match(value.strip()):
            raise InjectionError(
                f"annotation {key}: {value!r} is not a Kubernetes quantity (e.g. 100m, 128Mi)"
            )
        resources[section][resource] = value.strip()
    return {k: v for k, v in resources.items() if v}


def sidecar_container(
    wiring: Wiring, annotations: Mapping[str, str], engine: Settings, settings: OperatorSettings, native: bool
) -> dict[str, Any]:
    port = settings.sidecar_metrics_port

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": port},
            "periodSeconds": period,
            "failureThreshold": failures,
            "timeoutSeconds": 2,
        }

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.sidecar_image_pull_policy,
        "command": ["bucketq", "sidecar"],
        "env": sidecar_env(wiring, annotations, engine, settings),
        "ports": [{"name": "bq-metrics", "containerPort": port, "protocol": "TCP"}],
        "startupProbe": probe("/healthz", 1, 60),
        "readinessProbe": probe("/readyz", 5, 3),
        "livenessProbe": probe("/healthz", 10, 6),
        "resources": sidecar_resources(annotations, settings),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.sidecar_run_as_user,
            "runAsGroup": settings.sidecar_run_as_user,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if native:
        container["restartPolicy"] = "Always"
    return container


def plan(
    pod: Mapping[str, Any],
    consumer_spec: ConsumerSpec | None,
    *,
    engine: Settings,
    settings: OperatorSettings,
) -> Injection:
    """The mutation for ``pod`` (which wants injection and has no sidecar yet). Raises InjectionError."""
    annotations = annotations_of(pod)
    name = consumer_name(pod)
    wiring = resolve(annotations, name, consumer_spec)
    native = _flag(annotations, NATIVE, settings.sidecar_native)
    sidecar = sidecar_container(wiring, annotations, engine, settings, native)
    spec = pod.get("spec") or {}
    out = Injection()
    if native:
        out.spec["initContainers"] = [sidecar, *copy.deepcopy(spec.get("initContainers") or [])]
    containers = [_with_url(c, settings) for c in spec.get("containers") or []]
    out.spec["containers"] = containers if native else [*containers, sidecar]
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != TMP_VOLUME]
    out.spec["volumes"] = [*copy.deepcopy(volumes), {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}]
    out.annotations[INJECTED] = "true"
    if "prometheus.io/scrape" not in annotations:
        out.annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(settings.sidecar_metrics_port),
                "prometheus.io/path": "/metrics",
            }
        )
    return out


def _with_url(container: Mapping[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """An app container with ``BUCKETQ_SIDECAR_URL`` set (unless it sets it itself)."""
    out = copy.deepcopy(dict(container))
    env = out.setdefault("env", [])
    if not any(e.get("name") == URL_ENV for e in env):
        env.append({"name": URL_ENV, "value": f"http://127.0.0.1:{settings.sidecar_api_port}"})
    return out
