"""Runs the example worker app unchanged and writes down what it acked, for the demo's books.

    python -m bucketq.demo.worker_tap LEDGER WORKER.py [worker options...]

The worker module is loaded from its file and its ``Client`` swapped for a subclass that appends
``<message id> <unix time>`` to LEDGER for every entry the sidecar confirmed as acked. The demo
counts duplicates and losses from that file; the worker itself never knows.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterable
from typing import IO, Any

from bucketq.client import Client, DeliveredMessage, SettleBatchResponse, SettleResponse


class TapClient(Client):
    """A :class:`~bucketq.client.Client` that records each successful ack in :attr:`ledger`."""

    ledger: IO[str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ids: dict[str, str] = {}  # receipt -> message id, until settled

    def pull(self, max_messages: int = 10, wait: float = 0.0) -> list[DeliveredMessage]:
        msgs = super().pull(max_messages, wait)
        self._ids.update((m.receipt or "", m.id) for m in msgs)
        return msgs

    def ack(self, receipt: str) -> SettleResponse:
        response = super().ack(receipt)
        self._record([self._ids.pop(receipt, "")])
        return response

    def ack_batch(self, receipts: Iterable[str]) -> SettleBatchResponse:
        response = super().ack_batch(receipts)
        self._record([self._ids.pop(e.receipt, "") for e in response.results if e.status == 200])
        return response

    def _record(self, ids: list[str]) -> None:
        if self.ledger is not None:
            now = f"{time.time():.6f}"
            self.ledger.writelines(f"{i} {now}\n" for i in ids if i)
            self.ledger.flush()


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    ledger_path, worker_path, worker_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    spec = importlib.util.spec_from_file_location("demo_worker", worker_path)
    if spec is None or spec.loader is None:
        print(f"cannot load the worker app {worker_path}", file=sys.stderr)
        return 2
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    vars(worker)["Client"] = TapClient  # the worker calls Client(...) by its global name
    sys.argv = [worker_path, *worker_args]
    with open(ledger_path, "a", encoding="utf-8") as ledger:
        TapClient.ledger = ledger
        code: int = worker.main()
    return code


if __name__ == "__main__":
    sys.exit(main())
