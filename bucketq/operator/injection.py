"""Sidecar injection as a pure function: a pod (and its Consumer) in, the mutated pod spec parts out.

A pod asks for the sidecar with a **label** (what the webhook's objectSelector sees, so that no other
pod ever waits on the webhook)::

    bucketq.io/consumer: billing         the Consumer (group) this pod belongs to; enough on its own
    bucketq.io/inject: "true"            a sidecar without a consumer label (publish-only, or the
                                         consumer named by the annotation below)

Annotations on the pod (all optional)::

    bucketq.io/inject: "false"           no sidecar after all (also as a label)
    bucketq.io/consumer: billing         the Consumer, when the label does not name it
    bucketq.io/topics: orders,refunds    topics (default: the Consumer's)
    bucketq.io/delivery: pull|push       default: the Consumer's delivery mode
    bucketq.io/app-port: "8080"          push target port (default: the Consumer's push port)
    bucketq.io/app-path: /bucketq        push target path
    bucketq.io/api-port: "3580"          the sidecar's API port (BUCKETQ_SIDECAR_URL follows it)
    bucketq.io/metrics-port: "9580"      the sidecar's metrics and probe port (prometheus.io/port follows)
    bucketq.io/drain-grace-seconds: "20" at most this long draining leases after SIGTERM
    bucketq.io/termination-grace-seconds: "60"  the pod's terminationGracePeriodSeconds; the sidecar's
                                         shutdown budget is always derived from the effective one
    bucketq.io/s3-secret: name|none      Secret with accessKeyId/secretAccessKey ("none": pod identity)
    bucketq.io/native-sidecar: "false"   a regular container instead of a native sidecar
    bucketq.io/sidecar-cpu-request, -cpu-limit, -memory-request, -memory-limit: resource overrides
    bucketq.io/log-level: DEBUG|INFO|... the sidecar's log level
    bucketq.io/token-secret: name        Secret (key ``token``): the bearer token of the sidecar's API,
                                         mounted into the sidecar and given to app containers as
                                         ``BUCKETQ_API_TOKEN`` (``bucketq.io/api-token-secret`` is the
                                         same annotation under its former name)
    bucketq.io/push-token-secret: name   Secret (key ``token``): the bearer token the sidecar sends on
                                         push requests (``BUCKETQ_SIDECAR_APP_TOKEN``), given to app
                                         containers as ``BUCKETQ_PUSH_TOKEN`` to check
    bucketq.io/allow-host-network: "true"  inject into a hostNetwork pod (needs a token Secret)

The webhook owns the sidecar (docs/security.md): a pod that brings its own ``bucketq-sidecar``
container (one that differs from what the webhook would inject), or whose containers set a
``BUCKETQ_ROOT`` other than the namespace's, is rejected rather than silently overridden, so that
the pod's author learns at once that their container is not what runs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketq.config import PROFILES, Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.models import NAME_MAX, NAME_PATTERN, ConsumerSpec

PREFIX = "bucketq.io/"
INJECT = PREFIX + "inject"
CONSUMER = PREFIX + "consumer"
TOPICS = PREFIX + "topics"
DELIVERY = PREFIX + "delivery"
APP_PORT = PREFIX + "app-port"
APP_PATH = PREFIX + "app-path"
API_PORT = PREFIX + "api-port"
METRICS_PORT = PREFIX + "metrics-port"
DRAIN_GRACE = PREFIX + "drain-grace-seconds"
TERMINATION_GRACE = PREFIX + "termination-grace-seconds"
TOKEN_SECRET = PREFIX + "token-secret"
SECRET = PREFIX + "s3-secret"
NATIVE = PREFIX + "native-sidecar"
LOG_LEVEL = PREFIX + "log-level"
PROFILE = PREFIX + "profile"
API_TOKEN_SECRET = PREFIX + "api-token-secret"
PUSH_TOKEN_SECRET = PREFIX + "push-token-secret"
ALLOW_HOST_NETWORK = PREFIX + "allow-host-network"
INJECTED = PREFIX + "injected"
# The labels the webhook's objectSelectors match (chart and managed configuration alike).
CONSUMER_LABEL = CONSUMER
INJECT_LABEL = INJECT
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
ROOT_ENV = "BUCKETQ_ROOT"
TOKEN_KEY = "token"  # the key of both token Secrets
API_TOKEN_ENV = "BUCKETQ_API_TOKEN"  # app containers: the bearer token to send to the sidecar
PUSH_TOKEN_ENV = "BUCKETQ_PUSH_TOKEN"  # app containers: the token push requests carry
# The sidecar's setting for that token (SidecarSettings.app_token): it sends it on every push.
SIDECAR_PUSH_TOKEN_ENV = "BUCKETQ_SIDECAR_APP_TOKEN"
TOKEN_FILE_ENV = "BUCKETQ_SIDECAR_TOKEN_FILE"
TOKEN_VOLUME = "bucketq-api-token"
# The sidecar reads its API token from a file (not env): it stays out of /proc/<pid>/environ and
# out of crash dumps of the sidecar's environment.
TOKEN_DIR = "/var/run/secrets/bucketq.io/api-token"
# Fields the apiserver fills in when it defaults a pod: an injected sidecar seen again (a pod
# re-created from `kubectl get -o yaml`) carries them, and they change nothing the webhook sets.
_DEFAULTED = frozenset({"terminationMessagePath", "successThreshold", "scheme", "apiVersion", "defaultMode"})
# Kubernetes' terminationGracePeriodSeconds when a pod sets none.
DEFAULT_TERMINATION_GRACE_S = 30
# The sidecar's shutdown budget ends this long before the kubelet's SIGKILL at the end of the grace
# period: room for the process to exit after its deadline (contract with bucketq.sidecar).
SHUTDOWN_MARGIN_S = 5
MAX_GRACE_S = 86_400

_TRUE = {"true", "yes", "1", "on", "enabled"}
_FALSE = {"false", "no", "0", "off", "disabled"}
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[mkMGTPE]i?|Ki|[numk])?$")
_NAME = re.compile(NAME_PATTERN)
_LOG_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


class InjectionError(ValueError):
    """The pod cannot get a working sidecar (the message says what to fix)."""


@dataclass(slots=True)
class Injection:
    """The pod spec parts to replace and the labels and annotations to add."""

    spec: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def labels_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("labels") or {})


def _bool(value: str, where: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise InjectionError(f"{where}: {value!r} is not true or false")


def wants_injection(pod: Mapping[str, Any]) -> bool:
    """The pod asks for the sidecar: label ``bucketq.io/consumer``, or ``bucketq.io/inject`` true.

    ``bucketq.io/inject`` false (label or annotation) wins over everything. Raises InjectionError
    for an ``inject`` value that is neither true nor false.
    """
    labels = labels_of(pod)
    explicit = [
        _bool(value, f"{where} {INJECT}")
        for where, value in (("label", labels.get(INJECT)), ("annotation", annotations_of(pod).get(INJECT)))
        if value is not None
    ]
    if False in explicit:
        return False
    return True in explicit or bool(labels.get(CONSUMER, "").strip())


def already_injected(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    names = {c.get("name") for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]}
    return CONTAINER in names


def consumer_name(pod: Mapping[str, Any]) -> str | None:
    """The pod's Consumer: label or annotation ``bucketq.io/consumer`` (both: they must agree)."""
    label = labels_of(pod).get(CONSUMER, "").strip()
    annotation = annotations_of(pod).get(CONSUMER, "").strip()
    if label and annotation and label != annotation:
        raise InjectionError(
            f"label {CONSUMER} is {label!r} but annotation {CONSUMER} is {annotation!r}: name one Consumer"
        )
    value = label or annotation
    if not value:
        return None
    _check_name(value, f"{'label' if label else 'annotation'} {CONSUMER}")
    return value


def _check_name(value: str, where: str) -> None:
    if len(value) > NAME_MAX or not _NAME.match(value):
        raise InjectionError(
            f"{where}: {value!r} is not a valid name (lower-case letters, digits, '-' and '.', at most {NAME_MAX})"
        )


def _flag(annotations: Mapping[str, str], key: str, default: bool) -> bool:
    value = annotations.get(key)
    return default if value is None else _bool(value, f"annotation {key}")


def _int(annotations: Mapping[str, str], key: str, low: int, high: int, what: str) -> int | None:
    """An integer annotation within [low, high] (None when absent). Raises InjectionError."""
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise InjectionError(f"annotation {key}: {raw!r} is not {what} ({low}-{high})")
    return value


@dataclass(frozen=True, slots=True)
class Ports:
    """The sidecar's ports in the pod: its API (localhost) and its metrics and probes."""

    api: int
    metrics: int


def ports_of(annotations: Mapping[str, str], settings: OperatorSettings) -> Ports:
    """The operator's defaults, or the pod's ``api-port`` / ``metrics-port``. Raises InjectionError."""
    api = _int(annotations, API_PORT, 1, 65535, "a port number")
    metrics = _int(annotations, METRICS_PORT, 1, 65535, "a port number")
    ports = Ports(api or settings.sidecar_api_port, metrics or settings.sidecar_metrics_port)
    if ports.api == ports.metrics:
        raise InjectionError(
            f"the sidecar's API and metrics would both use port {ports.api}: set {API_PORT} and "
            f"{METRICS_PORT} to two different ports"
        )
    return ports


@dataclass(frozen=True, slots=True)
class Shutdown:
    """How long the pod may take to stop, and what the sidecar makes of it."""

    grace_s: int  # the pod's effective terminationGracePeriodSeconds
    set_grace_s: int | None  # what the webhook writes into the pod spec (the annotation asked)
    drain_s: float | None  # the pod's own drain limit (None: the sidecar's default)

    @property
    def budget_s(self) -> int:
        """The sidecar's whole shutdown (drain, release, close) ends before the kubelet's SIGKILL."""
        return max(1, self.grace_s - SHUTDOWN_MARGIN_S)


def shutdown_of(annotations: Mapping[str, str], pod_grace_s: Any) -> Shutdown:
    """The effective grace period: the annotation's (it sets the pod's), else the pod's, else 30 s.

    The annotation wins over the pod spec because the apiserver has already defaulted the pod's
    field to 30 when the webhook sees it: an explicit 30 and no value at all look the same.
    Raises InjectionError.
    """
    wanted = _int(annotations, TERMINATION_GRACE, 1, MAX_GRACE_S, "a number of seconds")
    if wanted is not None:
        grace = wanted
    elif isinstance(pod_grace_s, int) and not isinstance(pod_grace_s, bool) and pod_grace_s >= 0:
        grace = pod_grace_s
    else:
        grace = DEFAULT_TERMINATION_GRACE_S
    drain: float | None = None
    raw = annotations.get(DRAIN_GRACE)
    if raw is not None:
        try:
            drain = float(raw.strip())
        except ValueError:
            drain = -1.0
        if not 0 <= drain <= MAX_GRACE_S:  # also NaN and infinity
            raise InjectionError(
                f"annotation {DRAIN_GRACE}: {raw!r} is not a number of seconds (0-{MAX_GRACE_S})"
            )
    return Shutdown(grace, wanted, drain)


@dataclass(frozen=True, slots=True)
class Wiring:
    """What the sidecar serves, resolved from annotations, the Consumer and defaults."""

    consumer: str | None
    topics: list[str]
    delivery: str
    app_port: int | None
    app_path: str | None
    consumer_spec: ConsumerSpec | None


@dataclass(frozen=True, slots=True)
class Tokens:
    """The Secrets (key ``token``) holding the API token and the push token, if the pod names them."""

    api: str | None = None
    push: str | None = None


def tokens_of(annotations: Mapping[str, str], wiring: Wiring) -> Tokens:
    """The token Secrets named by annotations. Raises InjectionError."""
    names: dict[str, str | None] = {}
    for key in (TOKEN_SECRET, API_TOKEN_SECRET, PUSH_TOKEN_SECRET):
        value = annotations.get(key, "").strip()
        if value:
            _check_name(value, f"annotation {key}")
        names[key] = value or None
    short, long = names.pop(TOKEN_SECRET), names[API_TOKEN_SECRET]
    if short and long and short != long:
        raise InjectionError(
            f"annotations {TOKEN_SECRET} ({short!r}) and {API_TOKEN_SECRET} ({long!r}) name two API token "
            f"Secrets: keep {TOKEN_SECRET} only"
        )
    names[API_TOKEN_SECRET] = short or long
    if names[PUSH_TOKEN_SECRET] and wiring.delivery != "push":
        # A push token on a pull pod would be silently unused: the author expects pushes signed.
        raise InjectionError(f"annotation {PUSH_TOKEN_SECRET} needs push delivery (the pod pulls)")
    return Tokens(names[API_TOKEN_SECRET], names[PUSH_TOKEN_SECRET])


def _secret_env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}}}


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


def sidecar_root(engine: Settings) -> str:
    """The sidecar's ``BUCKETQ_ROOT``: the namespace under the operator's root (``$(...)``: kubelet expands it)."""
    return f"{engine.root}/$({NAMESPACE_ENV})" if engine.root else f"$({NAMESPACE_ENV})"


def sidecar_env(
    wiring: Wiring,
    annotations: Mapping[str, str],
    engine: Settings,
    settings: OperatorSettings,
    tokens: Tokens | None = None,
    pod_grace_s: Any = None,
) -> list[dict[str, Any]]:
    """Environment of the sidecar: engine settings (no secrets in clear), then its own settings.

    ``pod_grace_s``: the pod's ``terminationGracePeriodSeconds`` (the shutdown budget follows it).
    """
    tokens = tokens or Tokens()
    ports = ports_of(annotations, settings)
    shutdown = shutdown_of(annotations, pod_grace_s)
    env: list[dict[str, Any]] = [
        {"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "BUCKETQ_BACKEND", "value": "s3"},
        {"name": "BUCKETQ_S3_BUCKET", "value": engine.s3_bucket or ""},
        {"name": "BUCKETQ_S3_REGION", "value": engine.s3_region},
        {"name": "BUCKETQ_S3_PATH_STYLE", "value": str(engine.s3_path_style).lower()},
        {"name": "BUCKETQ_STRATEGY", "value": engine.strategy},
        {"name": ROOT_ENV, "value": sidecar_root(engine)},
    ]
    # wake pings (I14): advertised on the pod IP, on a fixed port a NetworkPolicy can allow
    if settings.sidecar_wake_port:
        env += [
            {
                "name": "BUCKETQ_PING__ADVERTISE_HOST",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            {"name": "BUCKETQ_PING__LISTEN_PORT", "value": str(settings.sidecar_wake_port)},
        ]
    else:
        env.append({"name": "BUCKETQ_PING__ENABLED", "value": "false"})
    endpoint = settings.sidecar_s3_endpoint_url or engine.s3_endpoint_url
    if endpoint:
        env.append({"name": "BUCKETQ_S3_ENDPOINT_URL", "value": endpoint})
    # the latency/cost trade-off (config.PROFILES): the pod's annotation, else its Consumer's
    profile = annotations.get(PROFILE, "").strip().lower()
    if profile and profile not in PROFILES:
        raise InjectionError(f"annotation {PROFILE}: {profile!r} is not one of {', '.join(PROFILES)}")
    if not profile and wiring.consumer_spec is not None:
        profile = wiring.consumer_spec.profile
    if profile:
        env.append({"name": "BUCKETQ_PROFILE", "value": profile})
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
        "LISTEN_PORT": ports.api,
        "METRICS_HOST": "0.0.0.0",
        "METRICS_PORT": ports.metrics,
        "DELIVERY": wiring.delivery,
        "CONSUMER": wiring.consumer,
        "TOPICS": ",".join(wiring.topics) if wiring.topics else None,
        "APP_PORT": wiring.app_port,
        "APP_PATH": wiring.app_path,
        "TOKEN_FILE": f"{TOKEN_DIR}/{TOKEN_KEY}" if tokens.api else None,
        "SHUTDOWN_BUDGET_S": shutdown.budget_s,
        "DRAIN_GRACE_S": _number(shutdown.drain_s),
    }
    spec = wiring.consumer_spec
    if spec is not None and wiring.consumer is not None:
        own.update(
            START_POSITION=spec.start_position,
            VISIBILITY_TIMEOUT_S=spec.visibility_timeout_seconds,
            MAX_IN_FLIGHT=spec.max_in_flight,
        )
        push = spec.delivery.push
        if push is not None:
            own.update(
                PUSH_CONCURRENCY=push.concurrency,
                PUSH_TIMEOUT_S=push.timeout_seconds,
                PUSH_BATCH_SIZE=push.batch_size,
                PUSH_FORMAT=push.format,
                PUSH_RETRY_INITIAL_S=_number(push.retry.initial_seconds),
                PUSH_RETRY_MAX_S=_number(push.retry.max_seconds),
                PUSH_RETRY_MULTIPLIER=_number(push.retry.multiplier),
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
    if tokens.push:
        env.append(_secret_env(SIDECAR_PUSH_TOKEN_ENV, tokens.push))
    return env


def _number(value: float | None) -> str | None:
    """A float as the sidecar reads it, without a float's noise (``2`` not ``2.0``, ``0.1`` as is)."""
    if value is None:
        return None
    return str(int(value)) if float(value).is_integer() else repr(float(value))


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
    wiring: Wiring,
    annotations: Mapping[str, str],
    engine: Settings,
    settings: OperatorSettings,
    native: bool,
    tokens: Tokens | None = None,
    pod_grace_s: Any = None,
) -> dict[str, Any]:
    tokens = tokens or Tokens()
    port = ports_of(annotations, settings).metrics

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
        "env": sidecar_env(wiring, annotations, engine, settings, tokens, pod_grace_s),
        "ports": [{"name": "bq-metrics", "containerPort": port, "protocol": "TCP"}]
        + (
            [{"name": "bq-wake", "containerPort": settings.sidecar_wake_port, "protocol": "UDP"}]
            if settings.sidecar_wake_port
            else []
        ),
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
    if tokens.api:
        container["volumeMounts"].append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
    if native:
        container["restartPolicy"] = "Always"
    return container


def sidecar_volumes(tokens: Tokens) -> list[dict[str, Any]]:
    """The pod volumes the sidecar mounts."""
    volumes: list[dict[str, Any]] = [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}]
    if tokens.api:
        volumes.append(
            {
                "name": TOKEN_VOLUME,
                # 0444: the sidecar runs as a non-root uid that does not own the files.
                "secret": {
                    "secretName": tokens.api,
                    "items": [{"key": TOKEN_KEY, "path": TOKEN_KEY}],
                    "defaultMode": 0o444,
                },
            }
        )
    return volumes


def plan(
    pod: Mapping[str, Any],
    consumer_spec: ConsumerSpec | None,
    *,
    engine: Settings,
    settings: OperatorSettings,
) -> Injection:
    """The mutation for ``pod`` (which wants injection). Raises InjectionError.

    A pod that already carries exactly the sidecar this would inject (the webhook's own work, seen
    again) gets an empty Injection; one carrying any other ``bucketq-sidecar`` is rejected.
    """
    annotations = annotations_of(pod)
    spec = pod.get("spec") or {}
    name = consumer_name(pod)
    wiring = resolve(annotations, name, consumer_spec)
    tokens = tokens_of(annotations, wiring)
    ports = ports_of(annotations, settings)
    shutdown = shutdown_of(annotations, spec.get("terminationGracePeriodSeconds"))
    out = Injection()
    _check_host_network(spec, annotations, tokens, ports, out.warnings)
    native = _flag(annotations, NATIVE, settings.sidecar_native)
    grace = spec.get("terminationGracePeriodSeconds")
    sidecar = sidecar_container(wiring, annotations, engine, settings, native, tokens, grace)
    volumes = sidecar_volumes(tokens)
    namespace = (pod.get("metadata") or {}).get("namespace")
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") != CONTAINER:
            _check_root(container, engine, namespace)
            _check_ports(container, ports, settings.sidecar_wake_port)
    _check_app_port(wiring, ports)
    if already_injected(pod):
        _check_own_sidecar(spec, sidecar, native, volumes, tokens)
        return out
    if not tokens.api:
        out.warnings.append(
            f"bucketq: no {TOKEN_SECRET}: the sidecar's API takes requests from every container of "
            f"this pod without a token; name a Secret with key '{TOKEN_KEY}' to require one"
        )
    _grace_warnings(shutdown, grace, out.warnings)
    if shutdown.set_grace_s is not None:
        out.spec["terminationGracePeriodSeconds"] = shutdown.set_grace_s
    if native:
        out.spec["initContainers"] = [sidecar, *copy.deepcopy(spec.get("initContainers") or [])]
    containers = [_with_env(c, ports.api, tokens) for c in spec.get("containers") or []]
    out.spec["containers"] = containers if native else [*containers, sidecar]
    ours = {v["name"] for v in volumes} | {TMP_VOLUME, TOKEN_VOLUME}
    kept = [v for v in spec.get("volumes") or [] if v.get("name") not in ours]
    out.spec["volumes"] = [*copy.deepcopy(kept), *volumes]
    # The label selects every injected pod, whichever label asked for it (the PodMonitor uses it).
    out.labels[INJECTED] = "true"
    out.annotations[INJECTED] = "true"
    if "prometheus.io/scrape" not in annotations:
        out.annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(ports.metrics),
                "prometheus.io/path": "/metrics",
            }
        )
    return out


def _grace_warnings(shutdown: Shutdown, pod_grace_s: Any, warnings: list[str]) -> None:
    """Say so when the annotation overrides a grace period the pod chose, or drain exceeds the budget."""
    chosen = pod_grace_s not in (None, DEFAULT_TERMINATION_GRACE_S)
    if shutdown.set_grace_s is not None and chosen and pod_grace_s != shutdown.set_grace_s:
        warnings.append(
            f"bucketq: {TERMINATION_GRACE} ({shutdown.set_grace_s}) replaces the pod's "
            f"terminationGracePeriodSeconds ({pod_grace_s})"
        )
    if shutdown.drain_s is not None and shutdown.drain_s > shutdown.budget_s:
        warnings.append(
            f"bucketq: {DRAIN_GRACE} ({_number(shutdown.drain_s)}) is longer than the sidecar's shutdown "
            f"budget ({shutdown.budget_s} s, the grace period {shutdown.grace_s} s less "
            f"{SHUTDOWN_MARGIN_S} s): draining stops at the budget; raise {TERMINATION_GRACE}"
        )


def _check_ports(container: Mapping[str, Any], ports: Ports, wake_port: int = 0) -> None:
    """An app container listening on a sidecar port would make one of the two fail to start."""
    for item in container.get("ports") or ():
        number = item.get("containerPort")
        if wake_port and number == wake_port and item.get("protocol", "TCP") == "UDP":
            raise InjectionError(
                f"container {container.get('name')!r} declares UDP port {number}, the sidecar's wake-ping "
                "port: the operator's BUCKETQ_OPERATOR_SIDECAR_WAKE_PORT moves it"
            )
        for what, port, key in (("API", ports.api, API_PORT), ("metrics", ports.metrics, METRICS_PORT)):
            if number == port:
                raise InjectionError(
                    f"container {container.get('name')!r} declares port {number}, the sidecar's {what} port "
                    f"in this pod: move the sidecar with annotation {key}"
                )


def _check_app_port(wiring: Wiring, ports: Ports) -> None:
    if wiring.app_port is not None and wiring.app_port in (ports.api, ports.metrics):
        raise InjectionError(
            f"the push target port {wiring.app_port} is a port of the sidecar itself: the app listens "
            f"elsewhere, or move the sidecar with annotations {API_PORT} / {METRICS_PORT}"
        )


def _check_host_network(
    spec: Mapping[str, Any],
    annotations: Mapping[str, str],
    tokens: Tokens,
    ports: Ports,
    warnings: list[str],
) -> None:
    """hostNetwork pods share the node's loopback: the sidecar's API would serve every such pod."""
    if not spec.get("hostNetwork"):
        return
    if not _flag(annotations, ALLOW_HOST_NETWORK, False):
        raise InjectionError(
            f"the pod uses hostNetwork: the sidecar would listen on the node's loopback "
            f"(127.0.0.1:{ports.api}, reachable by every hostNetwork pod of the node); "
            f'annotate {ALLOW_HOST_NETWORK}: "true" and name {TOKEN_SECRET} to accept that'
        )
    if not tokens.api:
        raise InjectionError(
            f"{ALLOW_HOST_NETWORK} needs {TOKEN_SECRET}: on the node's network the sidecar's API "
            "must require a token"
        )
    warnings.append(
        f"bucketq: hostNetwork pod: the sidecar's API port {ports.api} and metrics port "
        f"{ports.metrics} are on the node (one such pod per node)"
    )


def _check_root(container: Mapping[str, Any], engine: Settings, namespace: str | None) -> None:
    """No container of the pod may name another root: the namespace's prefix is the webhook's to set."""
    allowed = {sidecar_root(engine)}
    if namespace:
        allowed.add(sidecar_root(engine).replace(f"$({NAMESPACE_ENV})", namespace))
    for item in container.get("env") or ():
        if item.get("name") != ROOT_ENV:
            continue
        if "valueFrom" in item or item.get("value") not in allowed:
            raise InjectionError(
                f"container {container.get('name')!r} sets {ROOT_ENV} to {item.get('value', item.get('valueFrom'))!r}: "
                f"pods of this namespace use {' or '.join(sorted(allowed))!s} only (remove the variable)"
            )


def _check_own_sidecar(
    spec: Mapping[str, Any],
    sidecar: Mapping[str, Any],
    native: bool,
    volumes: list[dict[str, Any]],
    tokens: Tokens,
) -> None:
    """The pod's ``bucketq-sidecar`` is exactly the webhook's (else: rejected, never run as is)."""
    where = "initContainers" if native else "containers"
    found = [c for c in spec.get(where) or [] if c.get("name") == CONTAINER]
    fix = (
        f"remove container {CONTAINER!r} from the pod: the bucketq webhook injects it (its root, bucket and "
        "credentials are the namespace's, not the pod's)"
    )
    if not found:
        raise InjectionError(f"the pod declares its own {CONTAINER!r} outside spec.{where}: {fix}")
    problem = _difference(sidecar, found[0], CONTAINER)
    by_name = {v.get("name"): v for v in spec.get("volumes") or []}
    for volume in volumes:
        problem = problem or _difference(volume, by_name.get(volume["name"]), f"volume {volume['name']}")
    if problem is None:
        for container in spec.get("containers") or []:
            wanted = _with_env(container, None, tokens)
            problem = problem or _difference(wanted, container, f"container {container.get('name')}")
    if problem is not None:
        raise InjectionError(f"the pod declares its own {CONTAINER!r} ({problem}): {fix}")


def _difference(expected: Any, actual: Any, path: str) -> str | None:
    """Where ``actual`` differs from ``expected`` (None: the same, up to apiserver defaults)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path} is missing or not an object"
        for key, value in expected.items():
            found = _difference(value, actual.get(key), f"{path}.{key}")
            if found is not None:
                return found
        extra = sorted(set(actual) - set(expected) - _DEFAULTED)
        return f"{path} has {', '.join(extra)}" if extra else None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{path} differs"
        names = [item.get("name") if isinstance(item, dict) else None for item in actual]
        wanted = [item.get("name") if isinstance(item, dict) else None for item in expected]
        if names != wanted:  # env, mounts, ports: say which entries, not the first mismatch inside one
            return f"{path} lists {names}, not {wanted}"
        for index, (want, have) in enumerate(zip(expected, actual, strict=True)):
            name = want.get("name", index) if isinstance(want, dict) else index
            found = _difference(want, have, f"{path}[{name}]")
            if found is not None:
                return found
        return None
    return None if expected == actual else f"{path} is {actual!r}, not {expected!r}"


def _with_env(container: Mapping[str, Any], api_port: int | None, tokens: Tokens) -> dict[str, Any]:
    """An app container with the sidecar's URL (unless it sets it itself) and the tokens.

    ``api_port`` None: only the tokens (to check a pod injected before). A container that sets a
    token variable itself is rejected: its value would not be the one the sidecar has.
    """
    out = copy.deepcopy(dict(container))
    env = out.setdefault("env", [])
    if api_port is not None and not any(e.get("name") == URL_ENV for e in env):
        env.append({"name": URL_ENV, "value": f"http://127.0.0.1:{api_port}"})
    for var, secret, key in (
        (API_TOKEN_ENV, tokens.api, TOKEN_SECRET),
        (PUSH_TOKEN_ENV, tokens.push, PUSH_TOKEN_SECRET),
    ):
        if secret is None:
            continue
        wanted = _secret_env(var, secret)
        own = [e for e in env if e.get("name") == var]
        if not own:
            env.append(wanted)
        elif _difference(wanted, own[0], var) is not None:
            raise InjectionError(
                f"container {out.get('name')!r} sets {var} itself: the webhook gives it the token of "
                f"Secret {secret!r} ({key}); remove the variable"
            )
    return out
