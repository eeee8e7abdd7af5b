"""The ``bucketq`` command: global connection options and the command tree."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import typer

from bucketq._extras import install_hint, missing_module
from bucketq._typer_help import flags_take_no_value, reflow_help
from bucketq.cli import bench, consumers, demo, dev, dlq, gc, messages, peek, runner, stats, topics, worker
from bucketq.cli.connection import Connection
from bucketq.cli.errors import EXIT_ERROR

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


flags_take_no_value()


def _print_version(value: bool) -> None:
    if value:
        from bucketq import __version__

        typer.echo(f"bucketq {__version__}")
        raise typer.Exit()


@app.callback()
def connect(
    ctx: typer.Context,
    endpoint_url: str | None = typer.Option(
        None, "--endpoint-url", help="S3 endpoint URL. \\[default: AWS S3]"
    ),
    bucket: str | None = typer.Option(None, "--bucket", help="S3 bucket."),
    region: str | None = typer.Option(None, "--region", help="S3 region. \\[default: us-east-1]"),
    access_key_id: str | None = typer.Option(None, "--access-key-id", help="S3 access key id."),
    secret_access_key: str | None = typer.Option(None, "--secret-access-key", help="S3 secret access key."),
    root: str | None = typer.Option(None, "--root", help="Key prefix of every bucketq object in the bucket."),
    strategy: str | None = typer.Option(
        None, "--strategy", help="Put-if-absent strategy: auto, conditional_write or csprng_verify."
    ),
    backend: str | None = typer.Option(None, "--backend", help="Store: s3, file or memory. \\[default: s3]"),
    file_path: Path | None = typer.Option(None, "--file-path", help="Directory of the 'file' backend."),
    config: Path | None = typer.Option(
        None, "--config", help="YAML file with settings (keys as in BUCKETQ_*)."
    ),
    namespace: str | None = typer.Option(
        None,
        "--namespace",
        "-N",
        help="A Kubernetes namespace's queues under the operator's root: ROOT/NAMESPACE.",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the engine does."),
    debug: bool = typer.Option(False, "--debug", help="Debug logs, and tracebacks on errors."),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
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
        namespace=namespace,
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
app.add_typer(consumers.app, name="consumer")
app.add_typer(dlq.app, name="dlq")
app.command("publish")(messages.publish)
app.command("consume")(messages.consume)
app.command("peek")(peek.peek)
app.command("stats")(stats.stats)
app.command("gc")(gc.gc)
app.command("doctor")(importlib.import_module("bucketq.cli.doctor").doctor)
app.command("bench")(bench.bench)
app.command("demo")(demo.command)
app.command("dev")(dev.command)
app.command("worker")(worker.command)


def _needs_extra(name: str, extra: str) -> None:
    """Register ``bucketq NAME`` as a stand-in that prints the install hint and exits 1.

    It takes any arguments (``--help`` included): whatever the user typed, the answer is the same
    one line, not a usage error about options the stand-in does not know.
    """
    hint = install_hint(f"bucketq {name}", extra)

    def missing() -> None:
        typer.echo(hint, err=True)
        raise typer.Exit(EXIT_ERROR)

    app.command(
        name,
        # Not the hint itself: help text is rich markup, where "[sidecar]" would vanish as a tag.
        help=f"(not installed: needs the {extra} extra)",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(missing)


def _optional_commands() -> None:
    """Commands of the components that come with extras (sidecar, operator, spark).

    Whether an extra is installed is looked up without importing it, so ``bucketq --help`` stays
    fast; a missing one leaves a stand-in command that names the extra to install.
    """
    if missing_module("sidecar") is None:
        app.command("run", cls=runner.SplitAtDashes)(runner.command)
    else:
        _needs_extra("run", "sidecar")
    for name, extra, module, attr in (
        ("sidecar", "sidecar", "bucketq.sidecar.cli", "command"),
        ("operator", "operator", "bucketq.operator.cli", "command"),
        ("crds", "operator", "bucketq.operator.cli", "crds_command"),
    ):
        if missing_module(extra) is None:
            app.command(name)(getattr(importlib.import_module(module), attr))
        else:
            _needs_extra(name, extra)
    if missing_module("spark") is None:
        from bucketq.cli.spark import app as spark

        app.add_typer(spark, name="spark")
    else:
        _needs_extra("spark", "spark")


_optional_commands()
reflow_help(app)


def main() -> None:
    """Entry point of the ``bucketq`` console script."""
    app(prog_name="bucketq")
