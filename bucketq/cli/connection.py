"""How the CLI reaches the bucket: global flags over a YAML file over ``BUCKETQ_*`` env over defaults."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from bucketq import Bucketq, Settings


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``override``, merging nested mappings."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML config file (keys are Settings fields); ConfigError when unusable."""
    import yaml

    from bucketq.errors import ConfigError

    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path} must hold a mapping, got {type(data).__name__}")
    return data


@dataclass
class Connection:
    """The global connection options of one CLI invocation."""

    endpoint_url: str | None = None
    bucket: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    root: str | None = None
    strategy: str | None = None
    backend: str | None = None
    file_path: Path | None = None
    config: Path | None = None
    debug: bool = False
    namespace: str | None = None

    def flags(self) -> dict[str, Any]:
        """Settings fields given as flags."""
        fields = {
            "s3_endpoint_url": self.endpoint_url,
            "s3_bucket": self.bucket,
            "s3_region": self.region,
            "s3_access_key_id": self.access_key_id,
            "s3_secret_access_key": self.secret_access_key,
            "root": self.root,
            "strategy": self.strategy,
            "backend": self.backend,
            "file_path": str(self.file_path) if self.file_path is not None else None,
        }
        return {k: v for k, v in fields.items() if v is not None}

    def settings(self, **extra: Any) -> Settings:
        """Resolved settings: flags, then the YAML file, then ``BUCKETQ_*``, then defaults."""
        from bucketq import Settings

        data = read_yaml(self.config) if self.config is not None else {}
        merged = deep_merge(deep_merge(data, self.flags()), extra)
        _check_store_given(merged)
        settings = Settings.load(**merged)
        if self.namespace is None:
            return settings
        # the operator keeps each namespace's queues under {root}/{namespace} (core/keys.py)
        from bucketq.core.keys import namespace_root, validate_name

        validate_name(self.namespace, "namespace")
        return settings.model_copy(update={"root": namespace_root(settings.root, self.namespace)})

    @contextlib.asynccontextmanager
    async def open(self, **extra: Any) -> AsyncIterator[Bucketq]:
        """An open :class:`Bucketq` for the resolved settings."""
        from bucketq import Bucketq

        async with Bucketq(self.settings(**extra)) as bq:
            yield bq


NO_STORE = (
    "no bucket configured: give --bucket (and --endpoint-url) or BUCKETQ_S3_BUCKET, or start a local "
    'one with: eval "$(bucketq dev)" (or use a directory: --backend file --file-path DIR)'
)


def _check_store_given(merged: dict[str, Any]) -> None:
    """A first-run error that names the ways out, rather than the settings model's complaint."""
    import os

    from bucketq.cli.errors import CliError

    backend = merged.get("backend") or os.environ.get("BUCKETQ_BACKEND") or "s3"
    if backend == "s3" and not (merged.get("s3_bucket") or os.environ.get("BUCKETQ_S3_BUCKET")):
        raise CliError(NO_STORE)


def connection(ctx: typer.Context) -> Connection:
    """The :class:`Connection` the root callback stored in the click context."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Connection) else Connection()
