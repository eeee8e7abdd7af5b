"""A small worker app in pull mode: it talks to its sidecar over localhost HTTP only.

    bucketq run orders -- python examples/worker.py        # a sidecar consuming orders, and this app
    python examples/worker.py --url http://127.0.0.1:3580 --max-messages 1000   # a sidecar already running

It pulls batches, "processes" each message, acks the successes in one batch call and nacks
failures with a delay. With ``--publish-to`` it also publishes a result per message. It stops
on SIGTERM/SIGINT, after ``--max-messages``, or after ``--idle-exit`` seconds without work.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from bucketq.client import (
    BadRequest,
    Client,
    ConnectionFailed,
    DeliveredMessage,
    SidecarError,
    Unavailable,
    message,
)


def process(msg: DeliveredMessage) -> dict[str, Any]:
    """The app's business logic: here, summarise the order."""
    order = msg.payload if isinstance(msg.payload, dict) else {"value": msg.payload}
    return {"order": order.get("id"), "total": order.get("amount", 0), "attempt": msg.deliveries}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="sidecar URL (default $BUCKETQ_SIDECAR_URL or :3580)")
    parser.add_argument("--batch", type=int, default=50, help="messages per pull")
    parser.add_argument("--wait", type=float, default=2.0, help="long-poll seconds")
    parser.add_argument("--publish-to", default=None, help="topic to publish one result per message to")
    parser.add_argument("--max-messages", type=int, default=0, help="stop after this many (0: never)")
    parser.add_argument("--idle-exit", type=float, default=0.0, help="stop after this many idle seconds")
    args = parser.parse_args()

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    done = failed = 0
    started = last_work = time.monotonic()
    with Client(args.url) as client:
        while not stopping:
            if args.max_messages and done >= args.max_messages:
                break
            if args.idle_exit and time.monotonic() - last_work > args.idle_exit:
                break
            try:
                msgs = client.pull(max_messages=args.batch, wait=args.wait)
            except Unavailable as exc:  # starting, draining or S3 outage: back off
                time.sleep(exc.retry_after or 1.0)
                continue
            except ConnectionFailed:  # the sidecar is restarting: it comes back on its own
                time.sleep(1.0)
                continue
            except BadRequest as exc:
                if exc.code != "no_consumer":
                    raise
                print(
                    "the sidecar consumes no topic: name it, e.g. bucketq run orders -- python examples/worker.py "
                    "(or set BUCKETQ_SIDECAR_CONSUMER and BUCKETQ_SIDECAR_TOPICS)",
                    file=sys.stderr,
                )
                return 2
            if not msgs:
                continue
            last_work = time.monotonic()
            results, receipts = [], []
            for msg in msgs:
                try:
                    results.append(message(process(msg), key=msg.key))
                    receipts.append(msg.receipt or "")
                except Exception as exc:  # retry later; dead-lettered after maxDeliveries
                    failed += 1
                    client.nack(msg.receipt or "", delay=5.0, reason=str(exc)[:200])
            if args.publish_to and results:
                client.publish_batch(args.publish_to, results)
            try:
                acked = client.ack_batch(receipts)
            except SidecarError as exc:
                print(f"ack failed: {exc}", file=sys.stderr)
                continue
            lost = [r for r in acked.results if r.status == 409]
            done += len(receipts) - len(lost)
            if lost:
                print(
                    f"{len(lost)} leases expired before the ack: those messages will come again",
                    file=sys.stderr,
                )
            print(f"processed {done} messages ({done / (time.monotonic() - started):.0f}/s)", flush=True)
    print(f"worker done: {done} processed, {failed} failed, {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
