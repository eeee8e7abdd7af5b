"""The vandal: people and tools dropping objects into the bucket's prefixes (invariant I8, r11).

A bucket is shared: a ``.keep`` or ``README.txt`` in a partition's ``seg/``, an S3 console's folder
marker, a sync tool's lock file in a cursor log, a stray folder under ``subs/`` or at the root. The
vandal writes such **foreign** objects (names bucketq never writes) into every prefix of the run's
topics at random times, and **malformed** ones (names bucketq writes, bodies it cannot read): a
segment or a delta a few numbers past the tail, a checkpoint, a member heartbeat. Foreign objects
must stop nothing and be deleted by nothing but a topic's deletion (the runner records which ones
are still there: checker ``foreign_objects_kept``); malformed ones must stop nothing either (they
take their numbers as empty segments and deltas, I8).

Drawn per seed from its own generator (``Schedule.foreign``), so it joins schedules of every family
without changing the rest of them.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from bucketq.core.keys import Keys

from .actors import Role, Sim

if TYPE_CHECKING:
    from .process import SimProcess

FOREIGN_NAMES = [".keep", "README.txt", "0000000000000001.jsonl.bak", "desktop.ini", "~lock.tmp"]


class VandalRole(Role):
    kind = "vandal"

    def __init__(self, sim: Sim) -> None:
        super().__init__(sim, "vandal", faultable=False)
        self.rng = random.Random(f"vandal/{sim.schedule.seed}")

    async def run(self, proc: SimProcess) -> None:
        sim, s = self.sim, self.sim.schedule
        keys = Keys("")
        for _ in range(self.rng.randint(3, 8)):
            await asyncio.sleep(self.rng.uniform(0.5, max(1.0, s.chaos_s * 0.8 / 4)))
            if sim.quiescing:
                break
            topic = self.rng.choice(s.topics)
            groups = [g.name for g in s.groups if g.topic == topic.name] or ["g0"]
            group = self.rng.choice(groups)
            p = self.rng.randrange(topic.partitions)
            name = self.rng.choice(FOREIGN_NAMES)
            foreign = self.rng.choice(
                [
                    keys.segments_prefix(topic.name, p) + name,
                    keys.deltas_prefix(topic.name, group, p) + name,
                    keys.checkpoints_prefix(topic.name, group, p) + name,
                    keys.dedup_prefix(topic.name) + name,
                    keys.txn_prefix(topic.name) + name,
                    keys.members_prefix(topic.name, group) + name,
                    keys.members_topic_prefix(topic.name) + name,
                    keys.subs_prefix(topic.name) + "Archive/" + name,  # no consumer has this name
                    keys.subs_prefix(topic.name) + "stray/" + name,  # a valid name, no cursor under it
                    keys.topic_prefix(topic.name) + name,
                    keys.probes_prefix() + name,
                    "Team Folder/" + name,  # a folder at the root no topic can have
                ]
            )
            await self._drop(foreign, b"someone else's file\n", foreign=True)
            if self.rng.random() < 0.5:
                await self._malformed(keys, topic.name, group, p)

    async def _drop(self, key: str, body: bytes, *, foreign: bool) -> None:
        await self.sim.store.put(key, body)
        self.sim.history.record("vandal", key=key, foreign=foreign)
        if foreign:
            self.sim.foreign_keys.append(key)

    async def _malformed(self, keys: Keys, topic: str, group: str, p: int) -> None:
        """A name bucketq writes with a body it cannot read, where it does no harm to overwrite
        (past the tail; a heartbeat of no member): put-if-absent, as a writer would."""
        kind = self.rng.choice(["segment", "delta", "checkpoint", "heartbeat"])
        if kind == "segment":
            key = keys.segment(
                topic, p, await self._next(keys.segments_prefix(topic, p)) + self.rng.randint(1, 4)
            )
        elif kind == "delta":
            key = keys.delta(
                topic,
                group,
                p,
                await self._next(keys.deltas_prefix(topic, group, p)) + self.rng.randint(1, 3),
            )
        elif kind == "checkpoint":
            key = keys.checkpoint(topic, group, p, await self._next(keys.deltas_prefix(topic, group, p)) + 64)
        else:
            key = keys.member(topic, group, f"ghost-{self.rng.randrange(1000)}")
        if await self.sim.store.head(key) is None:
            await self._drop(key, self.rng.choice([b"", b"\x00\x01garbage", b'{"v":1,"n":']), foreign=False)

    async def _next(self, prefix: str) -> int:
        """One past the highest number listed under ``prefix`` (0 for none)."""
        top = -1
        async for info in self.sim.store.list(prefix):
            stem = info.key.rsplit("/", 1)[-1].split(".", 1)[0]
            if stem.isdigit():
                top = max(top, int(stem))
        return top + 1
