"""Configuration: one pydantic-settings model, loadable from env (``BUCKETQ_*``), YAML, a dict or a builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bucketq.errors import ConfigError

Strategy = Literal["auto", "conditional_write", "csprng_verify"]
Backend = Literal["s3", "file", "memory"]


class CsprngSettings(BaseModel):
    """Tuning of the csprng_verify put-if-absent emulation (docs/design.md 2.4)."""

    verify_retries: int = Field(2, ge=0, le=20)
    jitter_min_ms: int = Field(30, ge=0)
    jitter_max_ms: int = Field(120, ge=0)
    claim_timeout_s: float = Field(30.0, gt=0)


class ProducerSettings(BaseModel):
    """Group commit of the producer: a segment is flushed at linger, max messages or max bytes."""

    linger_ms: float = Field(20.0, ge=0)
    max_batch_messages: int = Field(1000, ge=1, le=100_000)
    max_batch_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_attempts: int = Field(50, ge=1)
    publish_timeout_s: float = Field(60.0, gt=0)
    dedup_window_s: float = Field(3600.0, gt=0)


class ConsumerSettings(BaseModel):
    """Defaults of every subscription member."""

    visibility_timeout_s: float = Field(30.0, gt=0)
    max_in_flight: int = Field(1000, ge=1)
    poll_min_ms: float = Field(10.0, gt=0)
    poll_max_ms: float = Field(100.0, gt=0)
    poll_idle_ms: float = Field(1000.0, gt=0)
    idle_after_s: float = Field(10.0, ge=0)
    foreign_poll_ms: float = Field(2000.0, gt=0)
    foreign_poll_max_s: float = Field(60.0, gt=0)
    steal_after_s: float = Field(2.0, ge=0)
    commit_linger_ms: float = Field(5.0, ge=0)
    refill_fraction: float = Field(0.5, gt=0, le=1)
    clock_skew_s: float = Field(2.0, ge=0)
    checkpoint_every: int = Field(64, ge=2)
    heartbeat_interval_s: float = Field(5.0, gt=0)
    member_ttl_s: float = Field(20.0, gt=0)
    start_position: Literal["earliest", "latest"] = "earliest"
    ordered: bool = False
    max_commit_attempts: int = Field(50, ge=1)


class Settings(BaseSettings):
    """Everything bucketq needs to reach its bucket and tune its loops.

    Environment keys are ``BUCKETQ_`` plus the field name in upper case
    (``BUCKETQ_S3_BUCKET``, ``BUCKETQ_STRATEGY``); nested groups use ``__``
    (``BUCKETQ_PRODUCER__LINGER_MS``).
    """

    model_config = SettingsConfigDict(
        env_prefix="BUCKETQ_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

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
        """Settings from the environment, with ``overrides`` taking precedence."""
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
        where = ".".join(str(p) for p in err["loc"]) or "configuration"
        parts.append(f"{where}: {err['msg']}")
    return "invalid bucketq configuration: " + "; ".join(parts)
