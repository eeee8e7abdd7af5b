"""Configuration: one pydantic-settings model, loadable from env (``BUCKETQ_*``), YAML, a dict or a builder."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, TypedDict

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bucketq.errors import ConfigError

Strategy = Literal["auto", "conditional_write", "csprng_verify"]
Backend = Literal["s3", "file", "memory"]
Profile = Literal["latency", "balanced", "economy"]


class CsprngSettings(BaseModel):
    """Tuning of the csprng_verify put-if-absent emulation (docs/design.md 2.4)."""

    verify_retries: int = Field(2, ge=0, le=20)
    jitter_min_ms: int = Field(30, ge=0)
    jitter_max_ms: int = Field(120, ge=0)
    claim_timeout_s: float = Field(30.0, gt=0)


class ProducerSettings(BaseModel):
    """Group commit of the producer (core/batching.py).

    A partition's buffer is written at once when nothing is in flight there, and what arrives
    during a write rides in the next one. ``linger_ms`` is the most a batch may wait for company:
    the producer lingers only while messages arrive fast enough that waiting fills the segment
    (at least one more expected within the linger), so awaited publishes are never held back.
    """

    linger_ms: float = Field(350.0, ge=0)
    # a batch stops lingering once it holds this many messages: its segment PUT (and the claim
    # delta that reads it) are then shared enough; waiting on would cost latency for cents (40:
    # what keeps 500 msg/s over 4 producers within $0.39 a million, docs/benchmarks.md)
    linger_fill_messages: int = Field(40, ge=1)
    max_batch_messages: int = Field(1000, ge=1, le=100_000)
    max_batch_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_attempts: int = Field(50, ge=1)
    publish_timeout_s: float = Field(60.0, gt=0)
    dedup_window_s: float = Field(3600.0, gt=0)


class ProducerOverrides(TypedDict, total=False):
    """Keyword arguments that override :class:`ProducerSettings` fields (the builder's
    ``producer()``); tests/test_public_api.py checks that they name exactly its fields."""

    linger_ms: float
    linger_fill_messages: int
    max_batch_messages: int
    max_batch_bytes: int
    max_attempts: int
    publish_timeout_s: float
    dedup_window_s: float


class ConsumerSettings(BaseModel):
    """Defaults of every subscription member."""

    visibility_timeout_s: float = Field(30.0, gt=0)
    max_in_flight: int = Field(1000, ge=1)
    poll_min_ms: float = Field(10.0, gt=0)
    poll_max_ms: float = Field(100.0, gt=0)
    # a topic idle (from this member's view) for idle_after_s: partitions are polled every
    # poll_idle_ms only (the fallback that correctness rests on), the topic's wake object every
    # wake_poll_ms (producers touch it when they start publishing; docs/protocol.md I13)
    poll_idle_ms: float = Field(120_000.0, gt=0)
    idle_after_s: float = Field(10.0, ge=0)
    wake_poll_ms: float = Field(5000.0, gt=0)
    foreign_poll_ms: float = Field(2000.0, gt=0)
    foreign_poll_max_s: float = Field(60.0, gt=0)
    steal_after_s: float = Field(2.0, ge=0)
    # settlements (ack, nack, extend, release) wait at most this long (and a tenth of the
    # visibility timeout) for company, riding along with the next claim delta when one comes
    # first; never while the app waits on them with nothing else in hand (Consumer._app_blocked)
    commit_linger_ms: float = Field(600.0, ge=0)
    refill_fraction: float = Field(0.5, gt=0, le=1)
    clock_skew_s: float = Field(2.0, ge=0)
    checkpoint_every: int = Field(64, ge=2)
    heartbeat_interval_s: float = Field(5.0, gt=0)
    member_ttl_s: float = Field(20.0, gt=0)
    # while the member's topic is idle: heartbeat (and membership/config refresh) this rarely;
    # the heartbeat then says how long it stays valid (3x this), so peers keep counting it
    heartbeat_idle_s: float = Field(30.0, gt=0)
    start_position: Literal["earliest", "latest"] = "earliest"
    ordered: bool = False
    max_commit_attempts: int = Field(50, ge=1)


class ConsumerTuning(TypedDict, total=False):
    """Keyword arguments that override :class:`ConsumerSettings` fields other than
    ``start_position`` (``register_consumer``, which takes that one as a parameter of its own)."""

    visibility_timeout_s: float
    max_in_flight: int
    poll_min_ms: float
    poll_max_ms: float
    poll_idle_ms: float
    idle_after_s: float
    wake_poll_ms: float
    foreign_poll_ms: float
    foreign_poll_max_s: float
    steal_after_s: float
    commit_linger_ms: float
    refill_fraction: float
    clock_skew_s: float
    checkpoint_every: int
    heartbeat_interval_s: float
    member_ttl_s: float
    heartbeat_idle_s: float
    ordered: bool
    max_commit_attempts: int


class ConsumerOverrides(ConsumerTuning, total=False):
    """Keyword arguments that override :class:`ConsumerSettings` fields (the builder's
    ``consumer()``); tests/test_public_api.py checks that they name exactly its fields."""

    start_position: Literal["earliest", "latest"]


class PingSettings(BaseModel):
    """Wake pings (docs/protocol.md I14): an idle member advertises a UDP address in its heartbeat
    and a producer that starts publishing pings it, so the member looks at the topic's wake object
    at once instead of on its next wake poll. Best effort: a lost ping costs latency, never data.
    """

    enabled: bool = True
    # the address advertised to producers; unset: the local address this host reaches the
    # bucket's endpoint from (the pod IP in a pod; the operator sets it from status.podIP)
    advertise_host: str | None = None
    # the address the socket binds; unset: the advertised address only (not every interface)
    listen_host: str | None = None
    # 0: a port the system chooses (the sidecar uses a fixed one a NetworkPolicy can name)
    listen_port: int = Field(0, ge=0, le=65535)

    @field_validator("advertise_host", "listen_host")
    @classmethod
    def _ip_literal(cls, value: str | None) -> str | None:
        # producers ping only IP literals (a heartbeat must not make them resolve names)
        if value:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an IP address") from None
        return value or None


# What each profile sets (fields the user sets explicitly win). Measured in docs/benchmarks.md.
PROFILES: dict[Profile, dict[str, dict[str, float]]] = {
    # lowest latency: no linger, fast polling; costs the most requests at low rates
    "latency": {
        "producer": {"linger_ms": 0.0},
        "consumer": {
            # acks ride the next claim delta of a stream of segments at most 100 ms apart
            # (cadence.settle_at): one cursor write a segment instead of two
            "commit_linger_ms": 100.0,
            # a paced stream's next segment is looked for every 12.5 ms once it is due
            "poll_max_ms": 25.0,
            "poll_idle_ms": 30_000.0,
            "wake_poll_ms": 500.0,
            "heartbeat_idle_s": 10.0,
        },
    },
    # the default: p50 publish->receive around 0.2-0.3 s at light load, cents per idle month
    "balanced": {
        # 200 ms: with standing claims (I20) a segment costs its PUT and GET only, so a paced
        # 50 msg/s stream fills ~3 messages a segment within $2.63 a million (docs/benchmarks.md)
        "producer": {"linger_ms": 200.0, "linger_fill_messages": 40},
        "consumer": {
            "commit_linger_ms": 600.0,
            "poll_max_ms": 100.0,
            "poll_idle_ms": 120_000.0,
            # wake pings bring the first message after a silence (I14); the poll is their fallback
            "wake_poll_ms": 5000.0,
            "heartbeat_idle_s": 30.0,
        },
    },
    # fewest requests: seconds of latency at light load
    "economy": {
        "producer": {"linger_ms": 1500.0, "linger_fill_messages": 1000},
        "consumer": {
            "commit_linger_ms": 3000.0,
            "poll_max_ms": 500.0,
            "poll_idle_ms": 300_000.0,
            "wake_poll_ms": 15_000.0,
            "heartbeat_interval_s": 10.0,
            "member_ttl_s": 40.0,
            "heartbeat_idle_s": 60.0,
        },
    },
}


def _with_profile(data: Any) -> Any:
    """Fill the producer and consumer fields the input leaves unset from ``data["profile"]``."""
    if not isinstance(data, dict):
        return data
    profile = data.get("profile", "balanced")
    if profile not in PROFILES:
        return data  # the field's own validation names the choices
    data = dict(data)
    for group, defaults in PROFILES[profile].items():
        given = data.get(group)
        if isinstance(given, BaseModel):
            given = given.model_dump(exclude_unset=True)
        data[group] = {**defaults, **(given or {})}
    return data


class Settings(BaseSettings):
    """Everything bucketq needs to reach its bucket and tune its loops.

    Environment keys are ``BUCKETQ_`` plus the field name in upper case
    (``BUCKETQ_S3_BUCKET``, ``BUCKETQ_STRATEGY``); nested groups use ``__``
    (``BUCKETQ_PRODUCER__LINGER_MS``).
    """

    model_config = SettingsConfigDict(
        env_prefix="BUCKETQ_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    profile: Profile = "balanced"
    backend: Backend = "s3"
    root: str = ""
    s3_endpoint_url: str | None = None
    s3_bucket: str | None = None
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_region: str = "us-east-1"
    s3_path_style: bool = True
    s3_connect_timeout_s: float = Field(5.0, gt=0)
    s3_read_timeout_s: float = Field(15.0, gt=0)
    s3_max_attempts: int = Field(6, ge=1)
    s3_max_pool_connections: int = Field(64, ge=1)
    file_path: Path | None = None
    strategy: Strategy = "auto"
    csprng: CsprngSettings = CsprngSettings()
    producer: ProducerSettings = ProducerSettings()
    consumer: ConsumerSettings = ConsumerSettings()
    ping: PingSettings = PingSettings()

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: Any) -> Any:
        return _with_profile(data)

    @model_validator(mode="after")
    def _check_backend(self) -> Self:
        if self.backend == "s3" and not self.s3_bucket:
            raise ValueError("backend 's3' needs s3_bucket (env BUCKETQ_S3_BUCKET)")
        if self.backend == "file" and self.file_path is None:
            raise ValueError("backend 'file' needs file_path (env BUCKETQ_FILE_PATH)")
        self.root = self.root.strip("/")
        return self

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Settings from the environment, with ``overrides`` taking precedence (``None`` values
        are left out). Raises :class:`~bucketq.ConfigError`."""
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        """Settings from a mapping with the field names as keys (the environment is ignored)."""
        if not isinstance(data, dict):
            raise ConfigError(f"configuration must be a mapping, got {type(data).__name__}")
        try:
            return _DictSettings(**data).to_settings()
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> Settings:
        """Settings from a YAML file whose keys are the field names."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"configuration file {path} is not valid YAML: {exc}") from None
        return cls.from_dict(data)

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict with secrets masked (safe to log)."""
        return self.model_dump(mode="json")


class SettingsOverrides(TypedDict, total=False):
    """Keyword arguments that override :class:`Settings` fields (``Bucketq.from_env``); a group
    (``producer``, ``consumer``, ...) is a settings object or a mapping of its fields.
    tests/test_public_api.py checks that they name exactly the fields of :class:`Settings`."""

    profile: Profile
    backend: Backend
    root: str
    s3_endpoint_url: str | None
    s3_bucket: str | None
    s3_access_key_id: str | SecretStr | None
    s3_secret_access_key: str | SecretStr | None
    s3_region: str
    s3_path_style: bool
    s3_connect_timeout_s: float
    s3_read_timeout_s: float
    s3_max_attempts: int
    s3_max_pool_connections: int
    file_path: str | Path | None
    strategy: Strategy
    csprng: CsprngSettings | Mapping[str, Any]
    producer: ProducerSettings | Mapping[str, Any]
    consumer: ConsumerSettings | Mapping[str, Any]
    ping: PingSettings | Mapping[str, Any]


class _DictSettings(Settings):
    """The same model, but reading only its arguments (no environment)."""

    model_config = SettingsConfigDict(extra="forbid", validate_default=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    def to_settings(self) -> Settings:
        return Settings.model_construct(**dict(self))


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        # a validator's ValueError reads "Value error, <our sentence>": the sentence alone
        msg = str(err["msg"]).removeprefix("Value error, ")
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {msg}" if where else msg)
    return "invalid bucketq configuration: " + "; ".join(parts)
