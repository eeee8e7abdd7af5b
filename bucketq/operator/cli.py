"""``bucketq operator`` and ``bucketq crds`` (typer-compatible commands; the CLI registers them lazily)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from bucketq.errors import ConfigError
from bucketq.log_levels import LogLevel


def command(
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-N",
            help="Namespace to serve (repeatable). \\[default: every namespace]",
            show_default=False,
        ),
    ] = None,
    webhook_port: Annotated[
        int | None, typer.Option(help="Admission webhook port. \\[default: 9443]", show_default=False)
    ] = None,
    no_webhook: Annotated[
        bool, typer.Option("--no-webhook", help="Do not serve the sidecar injector.")
    ] = False,
    webhook_only: Annotated[
        bool,
        typer.Option(
            "--webhook-only",
            help="Serve only the sidecar injector (no reconciliation): run several such replicas.",
        ),
    ] = False,
    metrics_port: Annotated[
        int | None, typer.Option(help="Queue metrics port, 0 for none. \\[default: 9090]", show_default=False)
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(help="Log level.", case_sensitive=False)] = LogLevel.INFO,
) -> None:
    """Run the operator: reconcile the custom resources, inject sidecars, export metrics.

    The resources are Topics, Consumers and DeadLetterPolicies.
    With --webhook-only it serves the sidecar injector alone (the Helm chart's webhook Deployment).
    The bucket comes from the engine settings (BUCKETQ_S3_*, credentials from a Secret), the
    operator's own settings from BUCKETQ_OPERATOR_*; options win over the environment.
    """
    from bucketq.config import Settings
    from bucketq.operator.config import OperatorSettings
    from bucketq.operator.runner import run

    overrides: dict[str, Any] = {
        "namespaces": namespace or None,
        "webhook_port": webhook_port,
        "webhook": False if no_webhook else None,
        "webhook_only": True if webhook_only else None,
        "metrics_port": metrics_port,
    }
    try:
        engine = Settings.load()
        settings = OperatorSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        typer.echo(f"bucketq operator: {exc}", err=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        )
        typer.echo(f"bucketq operator: invalid operator configuration: {problems}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=log_level.value,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from bucketq.operator.leader import LeadershipLost

    try:
        asyncio.run(run(engine, settings))
    except LeadershipLost as exc:
        # its work has stopped; the pod restarts as a standby (docs/operator.md, "High availability")
        typer.echo(f"bucketq operator: {exc}", err=True)
        raise typer.Exit(1) from None


def crds_command(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory to write the CRD YAML files to.")
    ] = Path("crds"),
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; fail if the files differ from the generated ones.")
    ] = False,
) -> None:
    """Generate the CustomResourceDefinitions (Topic, Consumer, DeadLetterPolicy) from the models."""
    from bucketq.operator.crds import rendered_files, write_crds

    if check:
        stale = [
            name
            for name, text in rendered_files().items()
            if not (out / name).exists() or (out / name).read_text() != text
        ]
        if stale:
            typer.echo(
                f"bucketq crds: out of date in {out}/: {', '.join(stale)} (run: bucketq crds)", err=True
            )
            raise typer.Exit(1)
        typer.echo(f"{out}/ is up to date")
        return
    for path in write_crds(out):
        typer.echo(f"wrote {path}")
