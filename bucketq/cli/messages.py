"""``bucketq publish`` and ``bucketq consume``."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.markup import escape

from bucketq.cli.connection import Connection, connection
from bucketq.cli.errors import EXIT_ERROR, CliError, fail, out, run, stderr, warn
from bucketq.cli.formats import DURATION_HELP, human_duration, parse_duration, parse_headers, parse_payload
from bucketq.cli.peek import print_message_line

if TYPE_CHECKING:
    from rich.console import Console

    from bucketq import Message, Producer, PublishResult
    from bucketq.core.producer import PreparedRecord

RAW_CONTENT_TYPE = "text/plain; charset=utf-8"
CLI_PRODUCER = "cli"
Settle = Literal["ack", "release", "dead"]  # what consume does with each message it printed


def publish(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic to publish to."),
    payloads: list[str] | None = typer.Argument(
        None,
        help="JSON payloads, one message each. Without any, one per line is read from stdin.",
        show_default=False,
    ),
    key: str | None = typer.Option(
        None, "--key", "-k", help="Message key (same key, same partition, in order)."
    ),
    header: list[str] = typer.Option([], "--header", "-H", help="Header name=value (repeatable)."),
    raw: bool = typer.Option(False, "--raw", help="Send each payload as text data instead of parsing JSON."),
    content_type: str | None = typer.Option(
        None, "--content-type", help=f"With --raw. \\[default: {RAW_CONTENT_TYPE}]"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON result per message."),
) -> None:
    """Publish messages; returns once every one is durable in the bucket."""
    conn = connection(ctx)
    run(_publish(conn, topic, payloads or [], key, header, raw, content_type, as_json), debug=conn.debug)


def _read_stdin() -> list[tuple[str, str]]:
    if sys.stdin is None or sys.stdin.isatty():
        raise CliError("nothing to publish: pass payloads as arguments or pipe one per line on stdin")
    lines = [(f"stdin line {n}", line.rstrip("\r\n")) for n, line in enumerate(sys.stdin, start=1)]
    return [(where, text) for where, text in lines if text.strip()]


def _bodies(texts: list[tuple[str, str]], raw: bool) -> list[tuple[Any, bytes | None]]:
    """Each message's body: (payload, None) parsed as JSON, or (None, data) with --raw."""
    if raw:
        return [(None, text.encode()) for _, text in texts]
    return [(parse_payload(text, where), None) for where, text in texts]


async def _publish(
    conn: Connection,
    topic: str,
    payloads: list[str],
    key: str | None,
    header: list[str],
    raw: bool,
    content_type: str | None,
    as_json: bool,
) -> None:
    from bucketq.core.keys import validate_name
    from bucketq.publish_options import PublishOptions

    validate_name(topic)
    if content_type is not None and not raw:
        raise CliError("--content-type needs --raw (JSON payloads are application/json)")
    options = PublishOptions(
        key=key,
        headers=parse_headers(header),
        content_type=(content_type or RAW_CONTENT_TYPE) if raw else None,
    )
    texts = [(f"argument {n}", p) for n, p in enumerate(payloads, start=1)] if payloads else _read_stdin()
    if not texts:
        raise CliError("nothing to publish: stdin had no lines")
    bodies = _bodies(texts, raw)
    async with conn.open() as bq:
        await bq.catalog.config(topic)  # an unknown topic before the producer registers
        producer = await bq.register_producer(CLI_PRODUCER)
        # all or nothing: every message is built and checked before any is sent, once
        prepared = [
            await producer.prepare(topic, payload, data=data, options=options) for payload, data in bodies
        ]
        outcomes = await _send(producer, prepared)
    _report_publish(topic, outcomes, as_json)


PROGRESS_FROM = 100  # a progress bar for bulk publishes of at least this many messages


async def _send(producer: Producer, prepared: list[PreparedRecord]) -> list[PublishResult | BaseException]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("publish"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr(),
        transient=True,
        disable=len(prepared) < PROGRESS_FROM,
    ) as bar:
        task = bar.add_task("publish", total=len(prepared))

        async def one(message: PreparedRecord) -> PublishResult:
            try:
                return await producer.publish_prepared(message)
            finally:
                bar.advance(task)

        return list(await asyncio.gather(*(one(m) for m in prepared), return_exceptions=True))


def _report_publish(topic: str, outcomes: list[PublishResult | BaseException], as_json: bool) -> None:
    done = [o for o in outcomes if not isinstance(o, BaseException)]
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if as_json:
        for r in done:
            typer.echo(
                json.dumps(
                    {
                        "id": r.id,
                        "topic": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "seq": r.seq,
                        "index": r.index,
                    }
                )
            )
    elif len(done) == 1:
        r = done[0]
        out().print(
            f"published message {r.id} to [bold]{escape(topic)}[/] (partition {r.partition}, "
            f"offset {r.offset})"
        )
    elif done:
        out().print(f"published {len(done)} messages to [bold]{escape(topic)}[/]")
    if failed:
        first = failed[0]
        if not done:
            raise first
        raise CliError(
            f"{len(failed)} of {len(outcomes)} messages not published; first error: {first}", EXIT_ERROR
        )


def consume(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic to consume from."),
    consumer: str = typer.Option(..., "--consumer", "-c", help="Consumer (group) name."),
    max_messages: int = typer.Option(
        10, "--max", "-n", min=1, help="Stop after this many messages (ignored with --follow)."
    ),
    wait: str = typer.Option(
        "5s",
        "--wait",
        "-w",
        help="Stop after this long without a message, counted from the member's first look at its "
        f"partitions ({DURATION_HELP}, or 0; not with --follow).",
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep consuming until interrupted (Ctrl-C), like a console consumer."
    ),
    no_ack: bool = typer.Option(
        False,
        "--no-ack",
        help="Give the messages back uncounted instead of acking (to only look, use bucketq peek).",
    ),
    dead_letter: bool = typer.Option(
        False,
        "--dead-letter",
        help="Nack each message without requeue: it moves to the dead-letter topic (reason nack).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per message."),
) -> None:
    """Print messages and ack each once printed (at least once).

    Consuming joins the consumer group (creating its subscription, which keeps the topic's data
    until it has consumed it: delete it with bucketq consumer delete). It stops after --max
    messages or --wait idle seconds; --follow runs until interrupted.
    """
    conn = connection(ctx)
    if no_ack and dead_letter:
        fail(CliError("give --no-ack or --dead-letter, not both"))
    settle: Settle = "release" if no_ack else "dead" if dead_letter else "ack"
    try:
        idle = 0.0 if wait.strip() in ("0", "0s") else parse_duration(wait)
    except CliError as exc:
        fail(exc)
    run(_consume(conn, topic, consumer, max_messages, idle, settle, as_json, follow), debug=conn.debug)


FOLLOW_BATCH = 100
# How long consume waits at most for the member's first look at its partitions (a store that
# does not answer for this long is reported by the "no messages" line, as any other wait).
FIRST_LOOK_MAX_S = 60.0


async def _consume(
    conn: Connection,
    topic: str,
    group: str,
    max_messages: int,
    wait: float,
    settle: Settle,
    as_json: bool,
    follow: bool = False,
) -> None:
    from bucketq.core.keys import validate_name

    validate_name(topic)
    validate_name(group, "consumer")
    no_ack = settle == "release"
    if follow and no_ack:
        raise CliError("--follow with --no-ack would hold every message leased: use bucketq peek to look")
    got, lost = 0, 0
    held: list[Message] = []  # with --no-ack, kept leased until the end so none is seen twice here
    async with conn.open() as bq:
        member = await bq.register_consumer(
            group, [topic], max_in_flight=FOLLOW_BATCH if follow else max_messages
        )
        # --wait counts from the member's first look at its partitions: on a large backlog or a
        # slow store the look itself may outlast a short wait, and must not read as "no messages"
        await member.first_look(FIRST_LOOK_MAX_S + wait)
        while follow or got < max_messages:
            want = FOLLOW_BATCH if follow else max_messages - got
            messages = await member.poll(max_messages=want, wait=wait if not follow else 5.0)
            if not messages:
                if follow:
                    continue
                break
            for msg in messages:
                print_message(msg, as_json, acked=settle == "ack")
            got += len(messages)
            if no_ack:
                held.extend(messages)
            else:
                lost += await _settle(messages, settle)
        lost += await _settle(held, "release")
        await member.close()
    if not got:
        stderr().print(
            f"[dim]no messages on {escape(topic)} for {escape(group)} within {human_duration(wait)}[/]"
        )
    if lost:
        raise CliError(
            f"{lost} message(s) printed but their lease was lost: they may be delivered again", EXIT_ERROR
        )


async def _settle(messages: list[Message], how: Settle) -> int:
    """Ack, give back uncounted (a look is not a failed delivery) or dead-letter a batch together;
    returns how many lost their lease."""
    calls = [
        m.ack() if how == "ack" else m.release() if how == "release" else m.nack(requeue=False)
        for m in messages
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    for exc in failed:
        warn(str(exc))
    return len(failed)


def message_json(msg: Message, *, acked: bool) -> dict[str, Any]:
    """The message as stored (its segment line) plus where it sits and how often it was delivered."""
    return {
        "id": msg.id,
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        **msg.record.to_json(),
        "deliveries": msg.deliveries,
        "acked": acked,
    }


def _body_text(msg: Message) -> str:
    if msg.data is None:
        return json.dumps(msg.payload, ensure_ascii=False)
    if msg.content_type.startswith("text/"):
        return msg.data.decode(errors="replace")
    return f"<{len(msg.data)} bytes {msg.content_type}>"


def print_message(msg: Message, as_json: bool, *, acked: bool, console: Console | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(message_json(msg, acked=acked), ensure_ascii=False))
        return
    meta = [f"delivery {msg.deliveries}"] if msg.deliveries > 1 else []
    print_message_line(
        console or out(),
        msg.partition,
        msg.offset,
        msg.created_at,
        msg.id,
        msg.key,
        msg.headers,
        meta,
        _body_text(msg),
    )
