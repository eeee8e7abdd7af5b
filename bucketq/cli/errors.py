"""Exit codes and one-line error reports: no tracebacks unless ``--debug``."""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import typer
from rich.markup import escape

from bucketq.cli.output import out, stderr

T = TypeVar("T")

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_STORAGE",
    "EXIT_USAGE",
    "CliError",
    "confirm",
    "fail",
    "out",
    "run",
    "stderr",
    "warn",
]

EXIT_OK = 0
EXIT_ERROR = 1  # anything else that went wrong
EXIT_USAGE = 2  # bad input: usage, config, payload, names, sizes, unknown topics
EXIT_STORAGE = 3  # the object store is unreachable or refuses us
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error the CLI reports as one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def warn(message: str) -> None:
    stderr().print(f"[yellow]warning:[/] {escape(message)}")


def confirm(question: str, action: str, yes: bool) -> None:
    """Go on with a destructive command only with ``--yes`` or a "y" typed at a terminal.

    Every destructive command asks alike: without ``--yes`` and with stdin not a terminal (a
    script, CI, a pipe) it refuses with a usage error naming ``--yes``, so that it neither hangs
    on a prompt nor takes its answer from piped data; a "no" at the prompt changes nothing, exit 1.
    """
    if yes:
        return
    if sys.stdin is None or not sys.stdin.isatty():
        fail(CliError(f"refusing to {action} without --yes (stdin is not a terminal)"))
    if not typer.confirm(question, default=False):
        stderr().print("not confirmed: nothing changed")
        raise typer.Exit(EXIT_ERROR)


def exit_code_for(exc: BaseException) -> int:
    """The exit code of an error raised by a command."""
    from bucketq.errors import (
        ConfigError,
        InvalidMessage,
        InvalidName,
        MessageTooLarge,
        StorageError,
        TopicNotFound,
    )

    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, (ConfigError, InvalidName, InvalidMessage, MessageTooLarge, TopicNotFound)):
        return EXIT_USAGE
    if isinstance(exc, StorageError):
        return EXIT_STORAGE
    return EXIT_ERROR


def fail(exc: BaseException, *, debug: bool = False) -> NoReturn:
    """Print ``exc`` as one red line (with the traceback when ``debug``) and exit with its code."""
    if debug:
        stderr().print(escape("".join(traceback.format_exception(exc))), end="")
    text = " ".join(str(exc).split()) or type(exc).__name__
    stderr().print(f"[bold red]error:[/] [red]{escape(text)}[/]")
    raise typer.Exit(exit_code_for(exc))


def run(coro: Coroutine[Any, Any, T], *, debug: bool = False) -> T:
    """Run a command's coroutine; turn every error into a one-line report and an exit code."""
    try:
        return asyncio.run(coro)
    except (typer.Exit, typer.Abort):
        raise
    except KeyboardInterrupt:
        stderr().print("[red]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:
        fail(exc, debug=debug)
