"""``bucketq demo``: the command's flags and its summary; the demo itself is :mod:`bucketq.demo`.

The demo package shows its progress on the console it is given and returns outcomes; the flags,
the summary and the exit codes are the command line's, here.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from bucketq.cli.errors import EXIT_ERROR, EXIT_USAGE, CliError, fail, run


class DemoMode(StrEnum):
    sidecar = "sidecar"
    library = "library"


class DemoBackend(StrEnum):
    moto = "moto"
    file = "file"


def command(
    mode: DemoMode = typer.Option(
        DemoMode.sidecar,
        "--mode",
        "-m",
        help="sidecar: a sidecar process and a worker app over HTTP; library: the engine in-process.",
    ),
    backend: DemoBackend = typer.Option(
        DemoBackend.moto,
        "--backend",
        "-b",
        help="moto: an S3 server started for the demo; file: a temp directory (library mode only).",
    ),
    messages: int | None = typer.Option(
        None,
        "--messages",
        "-n",
        min=1,
        help="Messages to publish. \\[default: 2000 in sidecar mode, 3000 in library mode]",
        show_default=False,
    ),
    producers: int | None = typer.Option(
        None,
        "--producers",
        min=1,
        help="Concurrent producers. \\[default: 2 in sidecar mode, 3 in library mode]",
        show_default=False,
    ),
    consumers: int = typer.Option(3, "--consumers", min=1, help="Concurrent consumers (library mode)."),
    partitions: int = typer.Option(4, "--partitions", min=1, help="Partitions of the demo topic."),
    batch: int = typer.Option(
        200, "--batch", min=1, max=1000, help="Messages per publish request (sidecar mode)."
    ),
    worker: Path | None = typer.Option(
        None,
        "--worker",
        help="The worker app (sidecar mode). \\[default: examples/worker.py]",
        show_default=False,
    ),
    timeout: float = typer.Option(
        120.0, "--timeout", min=1, help="Give up after this many seconds (sidecar mode)."
    ),
) -> None:
    """Run a queue end to end on an embedded S3 and show what it cost.

    Exits 1 on a lost or duplicated message, or a failed process.
    """
    from rich.console import Console

    console = Console(highlight=False)
    if mode is DemoMode.library:
        from bucketq.demo.library import run_library_demo

        outcome = run(
            run_library_demo(console, backend.value, messages or 3000, producers or 3, consumers, partitions)
        )
        if not outcome.ok:
            t = outcome.tracker
            fail(CliError(f"demo failed: {t.lost} lost, {t.duplicates} duplicates", EXIT_ERROR))
        return

    from bucketq.demo.processes import EXAMPLE_WORKER
    from bucketq.demo.sidecar import run_sidecar_demo, summary_table

    if backend is not DemoBackend.moto:
        fail(
            CliError("the sidecar demo runs on S3 (moto): use --mode library for --backend file", EXIT_USAGE)
        )
    app = worker or EXAMPLE_WORKER
    if not app.is_file():
        fail(
            CliError(f"worker app {app} not found (run from a source checkout, or pass --worker)", EXIT_USAGE)
        )
    result = run(
        run_sidecar_demo(
            console,
            messages=messages or 2000,
            producers=producers or 2,
            partitions=partitions,
            batch=batch,
            worker=app,
            timeout_s=timeout,
        )
    )
    if result.worker_summary:
        console.print(f"[dim]{result.worker_summary}[/]")
    console.print(summary_table(result))
    for name, tail in result.logs.items():
        console.print(f"[red]last lines of the {name}'s log:[/]")
        console.print(tail, markup=False, style="dim", soft_wrap=True)
    problems = result.problems()
    if problems:
        fail(CliError("demo failed: " + "; ".join(problems), EXIT_ERROR))
    console.print("[green]✓ every message published was consumed exactly once[/]")
