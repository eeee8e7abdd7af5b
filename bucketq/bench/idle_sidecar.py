"""``bucketq bench -s idle --via sidecar``: the idle group's members are sidecar processes.

Each member is ``python -m bucketq.sidecar`` on the run's bucket, and its app long-polls
``/v1/pull`` (20 s at a time) and acks what it gets, as a worker pod would. The requests are
counted at the S3 server (the sidecars' own connections are not the run's metered ones), so the
numbers are the bill of an idle sidecar, its producer side and its HTTP long-polls included.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bucketq.bench.idle import Members
from bucketq.bench.sidecar import _Sidecar, _start, _stop, _wait_ready
from bucketq.client import AsyncClient, SidecarError
from bucketq.config import Settings

LONG_POLL_S = 20.0
# The settings groups a sidecar member takes from the run; its wake-ping listener (ping) stays its own.
ENGINE_GROUPS = ("csprng", "producer", "consumer")


def sidecar_env(settings: Settings, group: str, topic: str) -> dict[str, str]:
    """The environment of a sidecar member of ``group`` on ``topic`` in the run's bucket.

    The sidecar is one of the run's members, so it runs with the run's engine settings: the
    profile's values and every ``--set`` (``BUCKETQ_CONSUMER__HEARTBEAT_INTERVAL_S=1``), not the
    profile's alone.
    """
    env = {
        "BUCKETQ_BACKEND": "s3",
        "BUCKETQ_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
        "BUCKETQ_S3_BUCKET": settings.s3_bucket or "",
        "BUCKETQ_S3_REGION": settings.s3_region,
        "BUCKETQ_STRATEGY": settings.strategy,
        "BUCKETQ_ROOT": settings.root,
        "BUCKETQ_PROFILE": settings.profile,
        "BUCKETQ_SIDECAR_CONSUMER": group,
        "BUCKETQ_SIDECAR_TOPICS": topic,
        "BUCKETQ_SIDECAR_METRICS_PORT": "0",
        "BUCKETQ_SIDECAR_DRAIN_GRACE_S": "5",
    }
    for name in ENGINE_GROUPS:
        for field_name, value in getattr(settings, name).model_dump(mode="json").items():
            text = value if isinstance(value, str) else json.dumps(value)
            env[f"BUCKETQ_{name.upper()}__{field_name.upper()}"] = text
    if settings.s3_access_key_id is not None:
        env["BUCKETQ_S3_ACCESS_KEY_ID"] = settings.s3_access_key_id.get_secret_value()
    if settings.s3_secret_access_key is not None:
        env["BUCKETQ_S3_SECRET_ACCESS_KEY"] = settings.s3_secret_access_key.get_secret_value()
    return env


@dataclass
class SidecarMembers(Members):
    """Sidecar processes, each with an app task that long-polls it."""

    sidecars: list[_Sidecar] = field(default_factory=list)
    clients: list[AsyncClient] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bucketq-bench-idle-")))

    @property
    def count(self) -> int:
        return len(self.sidecars)

    async def join(self) -> None:
        settings = self.fleet.run.settings
        env = sidecar_env(settings, self.fleet.group, self.fleet.topic)
        sidecar = _start(self.workdir, len(self.sidecars), env)
        self.sidecars.append(sidecar)
        await asyncio.to_thread(_wait_ready, sidecar)
        client = AsyncClient(sidecar.url, timeout=LONG_POLL_S + 30)
        self.clients.append(client)
        self.loops.append(asyncio.create_task(self._app(client)))

    async def _app(self, client: AsyncClient) -> None:
        """What the worker pod's app does: long-poll, handle, ack."""
        while not self.stop.is_set():
            try:
                msgs = await client.pull(max_messages=10, wait=LONG_POLL_S)
            except SidecarError:
                await asyncio.sleep(0.5)
                continue
            if not msgs:
                continue
            now = time.time()
            for m in msgs:
                self.tracker.on_received(m.created_at, now)
            started = time.perf_counter()
            result = await client.ack_batch([m.receipt or "" for m in msgs])
            for m, entry in zip(msgs, result.results, strict=True):
                if entry.status == 200:
                    self.tracker.on_acked(m.id, started)
                else:
                    self.tracker.on_ack_error()

    def check(self) -> None:
        super().check()
        for sidecar in self.sidecars:
            if sidecar.process.poll() is not None:
                raise RuntimeError(
                    f"sidecar exited with {sidecar.process.returncode}; see {sidecar.log_path}"
                )

    async def close(self) -> None:
        self.stop.set()
        for loop in self.loops:
            loop.cancel()  # a long-poll in flight would hold the close for its whole wait
        await asyncio.gather(*self.loops, return_exceptions=True)
        for client in self.clients:
            await client.close()
        await asyncio.gather(*(asyncio.to_thread(_stop, sc) for sc in self.sidecars))
