"""One leader-elected operator in a process of its own, for tests/operator/test_high_availability.py.

``python -m tests.operator.ha_worker CONFIG.json``: runs :func:`bucketq.operator.runner.serve` with
leader election against the emulated API server, and appends every start and end of a handler run
(reconciliation, refresh, garbage collection, finalizers) to the history file as a JSON line with
the time on the host's monotonic clock (one clock for every process of the host). Exit codes: 0
stopped, 3 the Lease was lost, 70 the process ended itself at the fence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.handlers import Operator
from bucketq.operator.leader import LeadershipLost
from bucketq.operator.runner import serve
from tests.operator.harness import login_to


class RecordingOperator(Operator):
    """The operator, writing down when each of its handlers starts and ends."""

    def __init__(self, engine: Settings, settings: OperatorSettings, history: Path, who: str) -> None:
        super().__init__(engine, settings)
        self.who = who
        self.fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, event: str, what: str, obj: str) -> None:
        line = {"who": self.who, "event": event, "what": what, "obj": obj, "t": time.monotonic()}
        os.write(self.fd, (json.dumps(line) + "\n").encode())  # one write: whole lines, kill -9 or not

    async def _run(self, what: str, handler: Callable[..., Awaitable[Any]], kwargs: dict[str, Any]) -> Any:
        obj = f"{kwargs.get('namespace')}/{kwargs.get('name')}"
        self.record("start", what, obj)
        try:
            return await handler(**kwargs)
        finally:
            self.record("end", what, obj)

    async def reconcile_topic(self, **kwargs: Any) -> Any:
        return await self._run("reconcile", super().reconcile_topic, kwargs)

    async def reconcile_consumer(self, **kwargs: Any) -> Any:
        return await self._run("reconcile", super().reconcile_consumer, kwargs)

    async def refresh(self, **kwargs: Any) -> Any:
        return await self._run("refresh", super().refresh, kwargs)

    async def collect_garbage(self, **kwargs: Any) -> Any:
        return await self._run("gc", super().collect_garbage, kwargs)

    async def finalize_topic(self, **kwargs: Any) -> Any:
        return await self._run("finalize", super().finalize_topic, kwargs)

    async def finalize_consumer(self, **kwargs: Any) -> Any:
        return await self._run("finalize", super().finalize_consumer, kwargs)


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    operator = RecordingOperator(
        Settings.from_dict(config["engine"]),
        OperatorSettings(**config["settings"]),
        Path(config["history"]),
        config["who"],
    )
    try:
        asyncio.run(serve(operator, login=login_to(config["url"])))
    except LeadershipLost as exc:
        print(f"ha_worker: {exc}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
