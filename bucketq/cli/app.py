"""The ``bucketq`` command: global connection options and the command tree."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import typer

from bucketq.cli import bench, messages, stats, topics
from bucketq.cli.connection import Connection

app = typer.Typer(
    name="bucketq",
    help="bucketq: a message queue whose only durable store is an S3-compatible bucket.\n\n"
    "Connection settings come from the flags below, then --config FILE.yaml, then BUCKETQ_* environment "
    "variables (BUCKETQ_S3_BUCKET, BUCKETQ_S3_ENDPOINT_URL, ...).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def connect(
    ctx: typer.Context,
    endpoint_url: str | None = typer.Option(
        None, "--endpoint-url", help="S3 endpoint URL (default: AWS S3)."
    ),
    bucket: str | None = typer.Option(None, "--bucket", help="S3 bucket."),
    region: str | None = typer.Option(None, "--region", help="S3 region (default us-east-1)."),
    access_key_id: str | None = typer.Option(None, "--access-key-id", help="S3 access key id."),
    secret_access_key: str | None = typer.Option(None, "--secret-access-key", help="S3 secret access key."),
    root: str | None = typer.Option(None, "--root", help="Key prefix of every bucketq object in the bucket."),
    strategy: str | None = typer.Option(
        None, "--strategy", help="Put-if-absent strategy: auto, conditional_write or csprng_verify."
    ),
    backend: str | None = typer.Option(None, "--backend", help="Store: s3, file or memory (default s3)."),
    file_path: Path | None = typer.Option(None, "--file-path", help="Directory of the 'file' backend."),
    config: Path | None = typer.Option(
        None, "--config", help="YAML file with settings (keys as in BUCKETQ_*)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the engine does."),
    debug: bool = typer.Option(False, "--debug", help="Debug logs, and tracebacks on errors."),
) -> None:
    """Connection options shared by every command."""
    ctx.obj = Connection(
        endpoint_url=endpoint_url,
        bucket=bucket,
        region=region,
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        root=root,
        strategy=strategy,
        backend=backend,
        file_path=file_path,
        config=config,
        debug=debug,
    )
    configure_logging(logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record arrives (test runners swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(level: int) -> None:
    """Log records of ``level`` and above to stderr; botocore stays quiet unless debugging."""
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("botocore", "aiobotocore", "aioboto3", "urllib3"):
        logging.getLogger(noisy).setLevel(level if level <= logging.DEBUG else logging.WARNING)


app.add_typer(topics.app, name="topic")
app.command("publish")(messages.publish)
app.command("consume")(messages.consume)
app.command("stats")(stats.stats)
app.command("bench")(bench.bench)


def _demo_command() -> None:
    from bucketq.demo import command

    app.command("demo")(command)


def _optional(module: str, attr: str) -> Any | None:
    """``module.attr`` if that component is installed, else None."""
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        return None


def _optional_commands() -> None:
    """Commands of components installed alongside (sidecar, operator, spark), when present."""
    for name, module, attr in (
        ("sidecar", "bucketq.sidecar.cli", "command"),
        ("operator", "bucketq.operator.cli", "command"),
        ("crds", "bucketq.operator.cli", "crds_command"),
    ):
        command = _optional(module, attr)
        if command is not None:
            app.command(name)(command)
    spark = _optional("bucketq.spark.cli", "app")
    if spark is not None:
        app.add_typer(spark, name="spark")


_demo_command()
_optional_commands()


def main() -> None:
    """Entry point of the ``bucketq`` console script."""
    app(prog_name="bucketq")
