"""The publisher of ``one-at-a-time``: a process of its own that publishes each message when told to.

The bench (:mod:`bucketq.bench.one_at_a_time`) runs the consumer in its own process and this one
as ``python -m bucketq.bench.publisher_process``, so that nothing the publisher does (its event
loop, its connection, its pings) shares a process with the consumer it is measured against.

The conversation is JSON lines. On stdin: first the configuration, then one ``{"n": N, "at": T}``
per message (publish message ``N`` at wall time ``T``: the bench decides when, from the arrival of
the previous one). On stdout: ``{"ready": true}`` once set up, then per message
``{"n": N, "id": ..., "sent": T0, "took": S}`` (``T0`` the wall time just before the publish call,
which the payload carries too; ``S`` the call's duration) or ``{"n": N, "error": "..."}``. The
process exits when stdin closes.

Kinds of publisher (``"kind"`` in the configuration):

* ``bucketq``: a library connection (``"settings"``: :class:`~bucketq.Settings` fields);
* ``sidecar``: an app speaking HTTP to a sidecar (``"url"``), as a worker pod's would;
* ``pawn``: pawn-queue's producer (``"pawn"``: its configuration), for the comparison.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

PublishFn = Callable[[dict[str, Any]], Awaitable[str]]


def payload(n: int, sent: float, size: int) -> dict[str, Any]:
    """The message: its number, the wall time just before its publish call, padding to ``size``."""
    bare = len(json.dumps({"n": n, "sent": sent, "pad": ""}, separators=(",", ":")))
    return {"n": n, "sent": sent, "pad": "x" * max(0, size - bare)}


async def _bucketq(config: dict[str, Any], stack: AsyncExitStack) -> PublishFn:
    from bucketq import Bucketq, Settings

    bq = await stack.enter_async_context(Bucketq(Settings.from_dict(config["settings"])))
    producer = await bq.register_producer(config.get("producer", "one-at-a-time"))
    topic = config["topic"]

    async def publish(body: dict[str, Any]) -> str:
        return (await producer.publish(topic, body)).id

    return publish


async def _sidecar(config: dict[str, Any], stack: AsyncExitStack) -> PublishFn:
    from bucketq.client import AsyncClient

    client = await stack.enter_async_context(AsyncClient(config["url"], timeout=60))
    topic = config["topic"]

    async def publish(body: dict[str, Any]) -> str:
        return (await client.publish(topic, body)).id

    return publish


async def _pawn(config: dict[str, Any], stack: AsyncExitStack) -> PublishFn:
    from pawn_queue import PawnQueue

    pawn = await PawnQueue.from_config(config["pawn"])
    await stack.enter_async_context(pawn)
    producer = await pawn.register_producer(config.get("producer", "one-at-a-time"))
    topic = config["topic"]

    async def publish(body: dict[str, Any]) -> str:
        message_id: str = await producer.publish(topic, body)
        return message_id

    return publish


KINDS: dict[str, Callable[[dict[str, Any], AsyncExitStack], Awaitable[PublishFn]]] = {
    "bucketq": _bucketq,
    "sidecar": _sidecar,
    "pawn": _pawn,
}


def _say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def _lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def main() -> None:
    reader = await _lines()
    config = json.loads(await reader.readline())
    size = int(config.get("payload_bytes", 200))
    async with AsyncExitStack() as stack:
        publish = await KINDS[config["kind"]](config, stack)
        _say({"ready": True})
        while line := await reader.readline():
            order = json.loads(line)
            n = int(order["n"])
            await asyncio.sleep(max(0.0, float(order["at"]) - time.time()))
            sent = time.time()  # just before the publish call: what the latency is measured from
            started = time.perf_counter()
            try:
                message_id = await publish(payload(n, sent, size))
            except Exception as exc:  # reported, not raised: the bench counts it
                _say({"n": n, "error": f"{type(exc).__name__}: {exc}"})
                continue
            _say({"n": n, "id": message_id, "sent": sent, "took": time.perf_counter() - started})


if __name__ == "__main__":
    asyncio.run(main())
