"""``bucketq worker MODULE:HANDLER TOPIC... -c CONSUMER``: run a handler function on a topic's messages.

The runner Celery, RQ and arq users expect: the handler is a plain function of one message,
``async def handle(msg)`` or ``def handle(msg)`` (run in a thread, so a slow one does not stall
the others), with exactly the semantics of :meth:`bucketq.Consumer.listen`, on which it runs:
returning acks the message, raising nacks it (redelivered and counted towards dead-lettering),
and its lease is extended for as long as the handler runs. Ctrl-C or SIGTERM stops taking new
messages, lets the running handlers finish, then leaves the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import CliError, fail, run, stderr

if TYPE_CHECKING:
    from bucketq import Message


def load_handler(spec: str) -> Callable[[Message], Awaitable[object]]:
    """``package.module:function`` as an async handler (a sync function runs in a thread).

    The current directory is importable, as with ``python -m`` and uvicorn's ``module:app``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"invalid handler {spec!r}: use module:function, e.g. tasks:handle")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}") from None
    func = module
    for part in attr.split("."):
        func = getattr(func, part, None)  # type: ignore[assignment]
        if func is None:
            raise CliError(f"module {module_name!r} has no {attr!r}")
    if not callable(func):
        raise CliError(f"{spec} is not a function")
    if inspect.iscoroutinefunction(func):
        return func

    async def in_thread(msg: Message) -> object:
        result = await asyncio.to_thread(func, msg)
        if inspect.isawaitable(result):  # a sync function that returned a coroutine
            return await result
        return result

    return in_thread


@dataclass
class Tally:
    acked: int = 0
    failed: int = 0


def command(
    ctx: typer.Context,
    handler: str = typer.Argument(..., help="The handler, module:function (from the current directory)."),
    topics: list[str] = typer.Argument(..., help="Topics to consume."),
    consumer: str = typer.Option(..., "--consumer", "-c", help="Consumer (group) name."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Messages handled at once."),
    max_messages: int | None = typer.Option(
        None, "--max", "-n", min=1, help="Stop after this many messages were handled. \\[default: never]"
    ),
) -> None:
    """Run a handler function on every message: return acks, raise nacks, leases extend.

    bucketq worker tasks:handle orders -c billing --concurrency 16. The handler takes one
    message (msg.payload, msg.key, msg.headers, msg.deliveries); a sync function runs in a
    thread. Ctrl-C or SIGTERM lets running handlers finish, then stops.
    """
    conn = connection(ctx)
    try:
        func = load_handler(handler)
    except CliError as exc:
        fail(exc)
    run(_work(conn, handler, func, topics, consumer, concurrency, max_messages), debug=conn.debug)


async def _work(
    conn: Connection,
    name: str,
    func: Callable[[Message], Awaitable[object]],
    topics: list[str],
    group: str,
    concurrency: int,
    max_messages: int | None,
) -> None:
    from bucketq.core.keys import validate_name

    for topic in topics:
        validate_name(topic)
    validate_name(group, "consumer")
    stop = asyncio.Event()
    tally = Tally()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def handle(msg: Message) -> None:
        started = time.monotonic()
        try:
            await func(msg)
        except Exception as exc:
            tally.failed += 1
            stderr().print(
                f"[yellow]{msg.topic} p{msg.partition}@{msg.offset}[/] failed (delivery {msg.deliveries}): "
                f"{type(exc).__name__}: {exc}; nacked",
                markup=True,
                highlight=False,
            )
            raise
        tally.acked += 1
        log_done(msg, time.monotonic() - started)
        if max_messages is not None and tally.acked + tally.failed >= max_messages:
            stop.set()

    try:
        async with conn.open() as bq:
            for topic in topics:
                await bq.catalog.config(topic)  # an unknown topic is an error, not an idle worker
            member = await bq.register_consumer(group, topics)
            stderr().print(
                f"worker {name}: consuming {', '.join(topics)} as {group} (concurrency {concurrency}); "
                "Ctrl-C to stop",
                highlight=False,
            )
            await member.listen(handle, concurrency=concurrency, stop=stop)
            await member.close()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    stderr().print(f"worker stopped: {tally.acked} acked, {tally.failed} failed", highlight=False)


def log_done(msg: Any, seconds: float) -> None:
    stderr().print(
        f"[dim]{msg.topic} p{msg.partition}@{msg.offset} done in {seconds * 1000:.0f}ms "
        f"(delivery {msg.deliveries})[/]",
        highlight=False,
    )
