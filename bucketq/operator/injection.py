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
    bucketq.io/api-token-secret: name    Secret (key ``token``): the bearer token of the sidecar's API,
                                         mounted into the sidecar and given to app containers as
                                         ``BUCKETQ_API_TOKEN``
    bucketq.io/push-token-secret: name   Secret (key ``token``): the bearer token the sidecar sends on
                                         push requests (``BUCKETQ_SIDECAR_APP_TOKEN``), given to app
                                         containers as ``BUCKETQ_PUSH_TOKEN`` to check
    bucketq.io/allow-host-network: "true"  inject into a hostNetwork pod (needs api-token-secret)

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
API_TOKEN_SECRET = PREFIX + "api-token-secret"
PUSH_TOKEN_SECRET = PREFIX + "push-token-secret"
ALLOW_HOST_NETWORK = PREFIX + "allow-host-network"
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


@dataclass(frozen=True, slots=True)
class Tokens:
    """The Secrets (key ``token``) holding the API token and the push token, if the pod names them."""

    api: str | None = None
    push: str | None = None


def tokens_of(annotations: Mapping[str, str], wiring: Wiring) -> Tokens:
    """The token Secrets named by annotations. Raises InjectionError."""
    names: dict[str, str | None] = {}
    for key in (API_TOKEN_SECRET, PUSH_TOKEN_SECRET):
        value = annotations.get(key, "").strip()
        if value:
            _check_name(value, f"annotation {key}")
        names[key] = value or None
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
) -> list[dict[str, Any]]:
    """Environment of the sidecar: engine settings (no secrets in clear), then its own settings."""
    tokens = tokens or Tokens()
    env: list[dict[str, Any]] = [
        {"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "BUCKETQ_BACKEND", "value": "s3"},
        {"name": "BUCKETQ_S3_BUCKET", "value": engine.s3_bucket or ""},
        {"name": "BUCKETQ_S3_REGION", "value": engine.s3_region},
        {"name": "BUCKETQ_S3_PATH_STYLE", "value": str(engine.s3_path_style).lower()},
        {"name": "BUCKETQ_STRATEGY", "value": engine.strategy},
        {"name": ROOT_ENV, "value": sidecar_root(engine)},
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
        "TOKEN_FILE": f"{TOKEN_DIR}/{TOKEN_KEY}" if tokens.api else None,
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
    if tokens.push:
        env.append(_secret_env(SIDECAR_PUSH_TOKEN_ENV, tokens.push))
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
    wiring: Wiring,
    annotations: Mapping[str, str],
    engine: Settings,
    settings: OperatorSettings,
    native: bool,
    tokens: Tokens | None = None,
) -> dict[str, Any]:
    tokens = tokens or Tokens()
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
        "env": sidecar_env(wiring, annotations, engine, settings, tokens),
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
    out = Injection()
    _check_host_network(spec, annotations, tokens, settings, out.warnings)
    native = _flag(annotations, NATIVE, settings.sidecar_native)
    sidecar = sidecar_container(wiring, annotations, engine, settings, native, tokens)
    volumes = sidecar_volumes(tokens)
    namespace = (pod.get("metadata") or {}).get("namespace")
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") != CONTAINER:
            _check_root(container, engine, namespace)
    if already_injected(pod):
        _check_own_sidecar(spec, sidecar, native, volumes, tokens)
        return out
    if not tokens.api:
        out.warnings.append(
            f"bucketq: no {API_TOKEN_SECRET}: the sidecar's API takes requests from every container of "
            f"this pod without a token; name a Secret with key '{TOKEN_KEY}' to require one"
        )
    if native:
        out.spec["initContainers"] = [sidecar, *copy.deepcopy(spec.get("initContainers") or [])]
    containers = [_with_env(c, settings, tokens) for c in spec.get("containers") or []]
    out.spec["containers"] = containers if native else [*containers, sidecar]
    ours = {v["name"] for v in volumes} | {TMP_VOLUME, TOKEN_VOLUME}
    kept = [v for v in spec.get("volumes") or [] if v.get("name") not in ours]
    out.spec["volumes"] = [*copy.deepcopy(kept), *volumes]
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


def _check_host_network(
    spec: Mapping[str, Any],
    annotations: Mapping[str, str],
    tokens: Tokens,
    settings: OperatorSettings,
    warnings: list[str],
) -> None:
    """hostNetwork pods share the node's loopback: the sidecar's API would serve every such pod."""
    if not spec.get("hostNetwork"):
        return
    if not _flag(annotations, ALLOW_HOST_NETWORK, False):
        raise InjectionError(
            f"the pod uses hostNetwork: the sidecar would listen on the node's loopback "
            f"(127.0.0.1:{settings.sidecar_api_port}, reachable by every hostNetwork pod of the node); "
            f'annotate {ALLOW_HOST_NETWORK}: "true" and name {API_TOKEN_SECRET} to accept that'
        )
    if not tokens.api:
        raise InjectionError(
            f"{ALLOW_HOST_NETWORK} needs {API_TOKEN_SECRET}: on the node's network the sidecar's API "
            "must require a token"
        )
    warnings.append(
        f"bucketq: hostNetwork pod: the sidecar's API port {settings.sidecar_api_port} and metrics port "
        f"{settings.sidecar_metrics_port} are on the node (one such pod per node)"
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


def _with_env(
    container: Mapping[str, Any], settings: OperatorSettings | None, tokens: Tokens
) -> dict[str, Any]:
    """An app container with the sidecar's URL (unless it sets it itself) and the tokens.

    ``settings`` None: only the tokens (to check a pod injected before). A container that sets a
    token variable itself is rejected: its value would not be the one the sidecar has.
    """
    out = copy.deepcopy(dict(container))
    env = out.setdefault("env", [])
    if settings is not None and not any(e.get("name") == URL_ENV for e in env):
        env.append({"name": URL_ENV, "value": f"http://127.0.0.1:{settings.sidecar_api_port}"})
    for var, secret, key in (
        (API_TOKEN_ENV, tokens.api, API_TOKEN_SECRET),
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
