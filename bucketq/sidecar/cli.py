"""``bucketq sidecar``: run the sidecar (a typer-compatible command; the CLI registers it lazily)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from bucketq._typer_help import flags_take_no_value, reflow_help
from bucketq.errors import ConfigError
from bucketq.log_levels import LogLevel


class DeliveryChoice(StrEnum):
    pull = "pull"
    push = "push"


def command(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="YAML file. \\[default: $BUCKETQ_SIDECAR_CONFIG]", show_default=False),
    ] = None,
    consumer: Annotated[
        str | None, typer.Option("--consumer", "-c", help="Consumer (group) name.", show_default=False)
    ] = None,
    topics: Annotated[
        str | None, typer.Option(help="Comma-separated topics to consume.", show_default=False)
    ] = None,
    delivery: Annotated[
        DeliveryChoice | None,
        typer.Option(
            help="pull: the app asks; push: the sidecar POSTs to the app. \\[default: pull]",
            show_default=False,
        ),
    ] = None,
    app_port: Annotated[
        int | None, typer.Option(help="The app's port (push mode).", show_default=False)
    ] = None,
    app_path: Annotated[
        str | None, typer.Option(help="The app's push path. \\[default: /bucketq]", show_default=False)
    ] = None,
    listen_host: Annotated[
        str | None, typer.Option(help="API address. \\[default: 127.0.0.1]", show_default=False)
    ] = None,
    listen_port: Annotated[
        int | None, typer.Option(help="API port. \\[default: 3580]", show_default=False)
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Metrics/probes port, 0 for none. \\[default: 9580]", show_default=False),
    ] = None,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(help="Log level. \\[default: INFO]", show_default=False, case_sensitive=False),
    ] = None,
) -> None:
    """Run the sidecar: the localhost HTTP API in front of the bucket (publish, pull/push, ack).

    Options also come from BUCKETQ_SIDECAR_* (engine: BUCKETQ_*) or the YAML file. Options win
    over the environment, which wins over the file.
    """
    from bucketq.sidecar.config import load_config
    from bucketq.sidecar.process import run

    overrides = {
        "consumer": consumer,
        "topics": topics,
        "delivery": delivery.value if delivery is not None else None,
        "app_port": app_port,
        "app_path": app_path,
        "listen_host": listen_host,
        "listen_port": listen_port,
        "metrics_port": metrics_port,
        "log_level": log_level.value if log_level is not None else None,
    }
    try:
        cfg = load_config(config, overrides=overrides)
    except ConfigError as exc:
        typer.echo(f"bucketq sidecar: {exc}", err=True)
        raise typer.Exit(2) from None
    level = logging.getLevelNamesMapping()[cfg.sidecar.log_level]
    logging.basicConfig(
        level=max(logging.INFO, level),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("bucketq").setLevel(level)  # DEBUG is ours, not botocore's
    code = asyncio.run(run(cfg))
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    """End the process at once: the shutdown is over and bounded by SHUTDOWN_BUDGET_S, but the
    interpreter's own teardown (botocore's modules and caches) can take another second. Nothing is
    left to flush but the log."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main() -> None:
    """Entry point of ``python -m bucketq.sidecar``: the same command, help and settings as
    ``bucketq sidecar`` (flags shown without a value type, ``-h`` accepted)."""
    flags_take_no_value()
    app = typer.Typer(
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.command(name="sidecar")(command)
    reflow_help(app)
    app(prog_name="python -m bucketq.sidecar")
