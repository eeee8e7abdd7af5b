"""A small worker app in push mode: the sidecar POSTs each message to it.

Run it with a sidecar that pushes to it::

    bucketq run orders --app-port 8080 -- python examples/push_worker.py

(or run the sidecar with ``BUCKETQ_SIDECAR_DELIVERY=push BUCKETQ_SIDECAR_APP_PORT=8080``, then
``python examples/push_worker.py --port 8080``).

The handler's answer decides each message's fate: ``SUCCESS`` acks it, ``RETRY`` gives it back
(redelivered after a delay that doubles with each failure by default, counted), ``DROP``
dead-letters it; an exception is a retry. ``BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S``, ``_MAX_S`` and
``_MULTIPLIER`` shape the delays (docs/sidecar-api.md, "Retries"). The sidecar keeps the
lease alive while the handler runs, however long it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from bucketq.client import DeliveredMessage, serve

log = logging.getLogger("push-worker")


async def handle(msg: DeliveredMessage) -> str:
    """Business logic: orders without an id can never succeed (DROP), others take a moment."""
    order = msg.payload if isinstance(msg.payload, dict) else {}
    if "id" not in order:
        log.warning("dropping malformed order %s", msg.id)
        return "DROP"
    if order.get("flaky") and msg.deliveries < 2:
        return "RETRY"  # e.g. a downstream service is busy: try again later
    await asyncio.sleep(0.01)
    log.info("order %s processed (delivery %d)", order["id"], msg.deliveries)
    return "SUCCESS"


def main() -> None:
    parser = argparse.ArgumentParser(description="bucketq push-mode example worker")
    parser.add_argument("--host", default="127.0.0.1")
    # bucketq run --app-port N tells the app its port in BUCKETQ_APP_PORT
    parser.add_argument("--port", type=int, default=int(os.environ.get("BUCKETQ_APP_PORT", "8080")))
    parser.add_argument("--path", default="/bucketq")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    serve(handle, host=args.host, port=args.port, path=args.path)


if __name__ == "__main__":
    main()
