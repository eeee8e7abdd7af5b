"""Sidecar configuration: ``BUCKETQ_SIDECAR_*`` environment, a mounted YAML file, and CLI overrides.

Precedence, highest first: explicit overrides (CLI options), environment variables, the YAML file
named by ``BUCKETQ_SIDECAR_CONFIG``, defaults. The YAML file holds the sidecar's keys at the top
level and the engine's :class:`~bucketq.config.Settings` under ``engine:``::

    consumer: billing
    topics: [orders]
    delivery: push
    app_port: 8080
    engine:
      s3_bucket: queues
      s3_endpoint_url: http://minio:9000
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bucketq.config import Settings
from bucketq.core.keys import validate_name
from bucketq.errors import ConfigError

CONFIG_ENV = "BUCKETQ_SIDECAR_CONFIG"
SIDECAR_PREFIX = "BUCKETQ_SIDECAR_"
ENGINE_PREFIX = "BUCKETQ_"

# Not Dapr's (3500 API, 50001 gRPC, 9090 metrics) nor Istio's (15000-15090): both may share the pod.
DEFAULT_API_PORT = 3580
DEFAULT_METRICS_PORT = 9580
MAX_RETRY_DELAY_S = 366 * 86_400.0  # the longest nack delay the API accepts

# Set by the kubelet in every container of a pod (whatever enableServiceLinks says).
POD_ENV = "KUBERNETES_SERVICE_HOST"

Delivery = Literal["pull", "push"]
PushFormat = Literal["json", "cloudevents-structured", "cloudevents-binary"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def default_metrics_host(env: Mapping[str, str] | None = None) -> str:
    """Where metrics and probes listen unless configured: every interface in a pod (the kubelet's
    probes and Prometheus come from outside the pod's network namespace), else loopback only (a
    sidecar on a laptop or a VM shows nothing to its network)."""
    return "0.0.0.0" if (os.environ if env is None else env).get(POD_ENV) else "127.0.0.1"


class SidecarSettings(BaseSettings):
    """What one sidecar serves: its consumer, delivery mode, listen addresses and limits."""

    model_config = SettingsConfigDict(env_prefix=SIDECAR_PREFIX, extra="forbid", validate_default=True)
    _deprecations: list[str] = PrivateAttr(default_factory=list)

    # the consumer (none: a publish-only sidecar)
    consumer: str | None = None
    topics: Annotated[list[str], NoDecode] = Field(default_factory=list)
    start_position: Literal["earliest", "latest"] | None = None
    visibility_timeout_s: float | None = Field(None, gt=0)
    max_in_flight: int | None = Field(None, ge=1)

    # delivery to the app
    delivery: Delivery = "pull"
    app_host: str = "127.0.0.1"
    app_port: int | None = Field(None, ge=1, le=65535)
    app_path: str = "/bucketq"
    push_concurrency: int = Field(16, ge=1, le=10_000)
    push_batch_size: int = Field(1, ge=1, le=1000)
    push_timeout_s: float = Field(600.0, gt=0)
    # the pushed request's form: the API's JSON, or a CloudEvent (bucketq.sidecar.push_request)
    push_format: PushFormat = "json"
    # The delay before the n-th redelivery of a pushed message that failed (n = its deliveries so
    # far) is min(max, initial * multiplier**(n-1)), halved and topped up by a uniform share of the
    # other half (equal jitter): see bucketq.sidecar.backoff. The message is nacked with that delay,
    # so no lease is held while it waits.
    push_retry_initial_s: float = Field(1.0, gt=0, le=MAX_RETRY_DELAY_S)
    push_retry_max_s: float = Field(60.0, gt=0, le=MAX_RETRY_DELAY_S)
    push_retry_multiplier: float = Field(2.0, ge=1.0, le=100.0)
    # deprecated alias of push_retry_initial_s (a fixed delay before); a warning is logged
    push_retry_delay_s: float | None = Field(None, gt=0, le=MAX_RETRY_DELAY_S)
    # A bearer token the sidecar sends to the app on every push (``Authorization: Bearer ...``), so
    # that the app can refuse pushes from anything else in the pod's network namespace. The file
    # wins over the inline value (a mounted Secret rotates without a restart of the operator).
    app_token: SecretStr | None = None
    app_token_file: Path | None = None

    # the localhost API
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(DEFAULT_API_PORT, ge=0, le=65535)
    token_file: Path | None = None
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_batch: int = Field(1000, ge=1, le=100_000)
    max_wait_s: float = Field(60.0, ge=0)
    # JSON values (objects, arrays, scalars) in one request body, counted before it is parsed: the
    # parsed form of a small body can be 50x its size, so the body limit alone does not bound memory.
    max_json_values: int = Field(100_000, ge=1000)
    max_json_depth: int = Field(64, ge=4, le=500)
    # A connection must send a complete request head within idle_timeout_s of opening or of its
    # previous response (covers idle keep-alive and headers trickled slowly); a body must arrive
    # within body_timeout_s once the head is in.
    idle_timeout_s: float = Field(30.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)

    # metrics and probes for Prometheus and the kubelet (0: only on the API port); the address
    # defaults to every interface in a pod only (default_metrics_host)
    metrics_host: str = Field(default_factory=default_metrics_host)
    metrics_port: int = Field(DEFAULT_METRICS_PORT, ge=0, le=65535)

    # publishing
    producer_name: str = "sidecar"
    publish_buffer_size: int = Field(10_000, ge=1)
    # bytes of accepted, not yet durable messages (their encoded records): a count alone lets large
    # messages pile up gigabytes while the bucket is down
    publish_buffer_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    publish_timeout_s: float = Field(10.0, gt=0)
    settle_timeout_s: float = Field(10.0, gt=0)
    s3_stall_s: float = Field(10.0, gt=0)  # not ready while an S3 request waits longer than this

    # lifecycle: from SIGTERM the process exits within shutdown_budget_s (drain, requeue of what
    # the app holds, release of prefetched leases, flush and close together); the drain phase
    # alone lasts at most drain_grace_s, clipped to the budget (see bucketq.sidecar.shutdown)
    shutdown_budget_s: float = Field(25.0, gt=0, le=86_400)
    drain_grace_s: float = Field(25.0, ge=0)
    connect_retry_max_s: float = Field(10.0, gt=0)
    log_level: LogLevel = "INFO"

    @field_validator("topics", mode="before")
    @classmethod
    def _split_topics(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("consumer")
    @classmethod
    def _consumer_name(cls, value: str | None) -> str | None:
        return None if value is None else validate_name(value, "consumer")

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: list[str]) -> list[str]:
        return [validate_name(t) for t in value]

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("app_path")
    @classmethod
    def _slash(cls, value: str) -> str:
        return value if value.startswith("/") else "/" + value

    @model_validator(mode="after")
    def _check(self) -> SidecarSettings:
        if self.consumer and not self.topics:
            raise ValueError("a consumer needs topics (BUCKETQ_SIDECAR_TOPICS=orders,payments)")
        if self.topics and not self.consumer:
            raise ValueError("topics need a consumer name (BUCKETQ_SIDECAR_CONSUMER)")
        if self.delivery == "push" and not self.consumer:
            raise ValueError("push delivery needs a consumer and topics")
        if self.delivery == "push" and self.app_port is None:
            raise ValueError("push delivery needs the app's port (BUCKETQ_SIDECAR_APP_PORT)")
        if self.push_format == "cloudevents-binary" and self.push_batch_size > 1:
            raise ValueError(
                "push_format cloudevents-binary carries one message per request: push_batch_size must be 1"
            )
        if self.publish_buffer_bytes < self.max_body_bytes:
            # else one request within the body limit could never fit the buffer
            raise ValueError("publish_buffer_bytes must be at least max_body_bytes")
        self._apply_retry_alias()
        if self.push_retry_max_s < self.push_retry_initial_s:
            raise ValueError(
                f"{SIDECAR_PREFIX}PUSH_RETRY_MAX_S ({self.push_retry_max_s:g}) must be at least "
                f"{SIDECAR_PREFIX}PUSH_RETRY_INITIAL_S ({self.push_retry_initial_s:g})"
            )
        return self

    def _apply_retry_alias(self) -> None:
        """PUSH_RETRY_DELAY_S (the old fixed delay) sets PUSH_RETRY_INITIAL_S, unless that is set too."""
        old = self.push_retry_delay_s
        if old is None:
            return
        if "push_retry_initial_s" in self.model_fields_set:
            if old != self.push_retry_initial_s:
                raise ValueError(
                    f"{SIDECAR_PREFIX}PUSH_RETRY_DELAY_S ({old:g}) is a deprecated alias of "
                    f"{SIDECAR_PREFIX}PUSH_RETRY_INITIAL_S ({self.push_retry_initial_s:g}) and "
                    "they disagree: set only PUSH_RETRY_INITIAL_S"
                )
        else:
            self.push_retry_initial_s = old
            if "push_retry_max_s" not in self.model_fields_set:
                # an old fixed delay above the default cap stays (about) what it was
                self.push_retry_max_s = max(self.push_retry_max_s, old)
        self._deprecations.append(
            f"{SIDECAR_PREFIX}PUSH_RETRY_DELAY_S is deprecated: it now sets "
            f"{SIDECAR_PREFIX}PUSH_RETRY_INITIAL_S ({old:g}s), the first of exponentially growing "
            "retry delays (see PUSH_RETRY_MAX_S and PUSH_RETRY_MULTIPLIER)"
        )

    @property
    def deprecations(self) -> list[str]:
        """Warnings about deprecated settings in use (the process logs them once at startup)."""
        return list(self._deprecations)

    @property
    def app_url(self) -> str:
        return f"http://{self.app_host}:{self.app_port}{self.app_path}"

    def token(self) -> str | None:
        """The bearer token from ``token_file`` (read at startup), or None when auth is off."""
        if self.token_file is None:
            return None
        try:
            text = self.token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read token file {self.token_file}: {exc.strerror}") from None
        if not text:
            raise ConfigError(f"token file {self.token_file} is empty")
        return text

    def push_token(self) -> str | None:
        """The bearer token sent to the app on push (``app_token_file`` or ``app_token``), or None."""
        if self.app_token_file is not None:
            try:
                text = self.app_token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read app token file {self.app_token_file}: {exc.strerror}"
                ) from None
            if not text:
                raise ConfigError(f"app token file {self.app_token_file} is empty")
            return text
        if self.app_token is not None and self.app_token.get_secret_value().strip():
            return self.app_token.get_secret_value().strip()
        return None


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """The sidecar's own settings and the engine settings it opens the bucket with."""

    sidecar: SidecarSettings
    engine: Settings


def load_config(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
) -> SidecarConfig:
    """Read the YAML file (``path`` or ``$BUCKETQ_SIDECAR_CONFIG``), then env, then ``overrides``."""
    env = os.environ
    path = path or env.get(CONFIG_ENV) or None
    data = _read_yaml(Path(path)) if path else {}
    engine_data = data.pop("engine", None) or {}
    if not isinstance(engine_data, dict):
        raise ConfigError("configuration key 'engine' must be a mapping of bucketq settings")
    sidecar_data = _without_env(data, SIDECAR_PREFIX, env)
    sidecar_data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        sidecar = SidecarSettings(**sidecar_data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, "sidecar")) from None
    engine = Settings.load(**_without_env(engine_data, ENGINE_PREFIX, env))
    return SidecarConfig(sidecar, engine)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read sidecar configuration {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"sidecar configuration {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"sidecar configuration {path} must be a mapping")
    return data


def _without_env(data: Mapping[str, Any], prefix: str, env: Mapping[str, str]) -> dict[str, Any]:
    """``data`` minus the keys the environment sets (so that env wins over the file), recursively."""
    names = {k.upper() for k in env}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = prefix + str(key).upper()
        if name in names:
            continue
        out[key] = _without_env(value, name + "__", env) if isinstance(value, dict) else value
    return out


def _explain(exc: ValidationError, what: str) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["ctx"]["error"]) if err["type"] == "value_error" and "ctx" in err else err["msg"]
        parts.append(f"{where}: {msg}" if where else msg)
    return f"invalid {what} configuration: " + "; ".join(parts)
