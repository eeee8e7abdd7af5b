"""Store checks: does a store do what the protocol assumes of it? (``bucketq doctor``, the operator)

The protocol (docs/protocol.md) is correct only on a store that keeps a few promises. S3-compatible
stores differ, and a store that breaks one loses or duplicates messages without an error: a user
must learn it before trusting the store, not after. Each check here tests one promise through the
storage port, against the live store, under a prefix of its own (``{root}/_doctor/{run}/``) that
is deleted afterwards; nothing of the queues is read or written.

* ``put_if_absent``: put-if-absent, as the engine does it (the strategy in effect), is atomic
  under **concurrent** writers: of many writers racing for one key exactly one is told it won, and
  the key holds its bytes. One sequential probe proves nothing (moto answers a second
  ``If-None-Match: *`` PUT with 412, yet lets racing ones all succeed, the last one's bytes
  winning): many rounds race at once.
* ``if_match``: a PUT with ``If-Match`` writes only over that ETag (a stale or missing ETag is
  refused), and ``If-None-Match: *`` refuses an existing key.
* ``read_after_write``: a GET and a HEAD right after a PUT (new key or overwrite) or a DELETE see it.
* ``list_after_write``: a LIST right after PUTs shows every key, and after the DELETE none of them.
* ``clock``: the host clock agrees with the store's within the tolerance. The store's clock is
  read as the protocol reads it: the Last-Modified of an object it has just written (S3 gives it
  to the second). Ages that decide deletion are measured on the store's clock; a host clock that
  is off makes every age this host computes from its own clock wrong by as much.

Every check returns a :class:`CheckResult` with a verdict (``pass``, ``fail``, or ``skip`` when
an earlier failure makes it meaningless); :func:`check_store` runs them all. A storage error (or
an answer the adapter cannot read) in a check is that check's failure, never an exception out of
here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bucketq.errors import AlreadyExists, Contended, PreconditionFailed, StorageError
from bucketq.storage.strategies import Storage

Verdict = Literal["pass", "fail", "skip"]
DOCTOR_PREFIX = "_doctor/"

# Racing writers per round and rounds at once: 96 conditional PUTs in flight together. Enough for
# a store that serialises nothing to show it (moto: several winners in most rounds), few enough
# for a store that makes losers wait (SeaweedFS: 1-13 s) to finish in about 15 s.
DEFAULT_WRITERS = 8
DEFAULT_ROUNDS = 12
RACE_BODY_BYTES = 256 * 1024
CONTENDED_RETRIES = 5  # a writer told "contended" (409) tries again, as the engine does
READ_ROUNDS = 10
LIST_KEYS = 20
# S3's Last-Modified is whole seconds, truncated: a fresh object can look up to 1 s older
LAST_MODIFIED_RESOLUTION_S = 1.0
DEFAULT_CLOCK_TOLERANCE_S = 2.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict."""

    name: str
    title: str
    verdict: Verdict
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "verdict": self.verdict,
            "summary": self.summary,
            "details": self.details,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class StoreReport:
    """Every check's verdict on one store."""

    strategy: str
    checks: list[CheckResult]

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.failed]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strategy": self.strategy,
            "checks": [c.to_json() for c in self.checks],
        }


class _Violation(Exception):
    """A promise the store broke (the check fails with this message and these details)."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


TITLES = {
    "reachable": "the store answers",
    "put_if_absent": "put-if-absent is atomic under concurrent writers",
    "if_match": "If-Match and If-None-Match are honoured",
    "read_after_write": "reads see the last write (read-after-write)",
    "list_after_write": "listings see the last writes (list-after-write)",
    "clock": "the host clock agrees with the store's",
}


async def _timed(name: str, check: Callable[[], Awaitable[tuple[str, dict[str, Any]]]]) -> CheckResult:
    started = time.monotonic()
    title = TITLES[name]
    try:
        summary, details = await check()
    except _Violation as exc:
        return CheckResult(name, title, "fail", str(exc), exc.details, time.monotonic() - started)
    except Exception as exc:  # a storage error, or an answer the adapter cannot read: a failure
        return CheckResult(
            name,
            title,
            "fail",
            f"the store failed the check: {type(exc).__name__}: {exc}",
            {"error": type(exc).__name__},
            time.monotonic() - started,
        )
    return CheckResult(name, title, "pass", summary, details, time.monotonic() - started)


def _skip(name: str, why: str) -> CheckResult:
    return CheckResult(name, TITLES[name], "skip", why)


class StoreChecks:
    """The checks on one :class:`Storage`, under ``{root}/_doctor/{run}/``."""

    def __init__(
        self,
        storage: Storage,
        root: str = "",
        *,
        writers: int = DEFAULT_WRITERS,
        rounds: int = DEFAULT_ROUNDS,
        clock_tolerance_s: float = DEFAULT_CLOCK_TOLERANCE_S,
        now: Callable[[], float] = time.time,
    ) -> None:
        if writers < 2 or rounds < 1:
            raise ValueError("a race needs at least 2 writers and 1 round")
        self.storage = storage
        self.store = storage.store
        root = root.strip("/")
        self.prefix = f"{root}/{DOCTOR_PREFIX}" if root else DOCTOR_PREFIX
        self.run = f"{self.prefix}{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}/"
        self.writers = writers
        self.rounds = rounds
        self.clock_tolerance_s = clock_tolerance_s
        self.now = now

    def key(self, rest: str) -> str:
        return self.run + rest

    async def run_all(self) -> StoreReport:
        """Every check; the objects written are deleted afterwards (a failure to is logged in the
        result of the reachability check's details, never raised)."""
        results = [await _timed("reachable", self.reachable)]
        names = ("put_if_absent", "if_match", "read_after_write", "list_after_write", "clock")
        if results[0].failed:
            results += [_skip(n, "the store does not answer") for n in names]
            return StoreReport(self.storage.strategy, results)
        try:
            results.append(await _timed("put_if_absent", self.put_if_absent))
            results.append(await _timed("if_match", self.if_match))
            results.append(await _timed("read_after_write", self.read_after_write))
            results.append(await _timed("list_after_write", self.list_after_write))
            results.append(await _timed("clock", self.clock))
        finally:
            await self._clean_up()
        return StoreReport(self.storage.strategy, results)

    async def _clean_up(self) -> None:
        try:
            keys = [info.key async for info in self.store.list(self.run)]
            if keys:
                await self.store.delete(keys)
        except StorageError:
            pass  # the store failed a check already, or is failing now: the run's prefix stays

    # -- the checks ------------------------------------------------------------------------------

    async def reachable(self) -> tuple[str, dict[str, Any]]:
        check = getattr(self.store, "check", None)
        if check is not None:
            await check()
        async for _ in self.store.list(self.run):
            break
        return "the bucket answered a LIST", {}

    async def put_if_absent(self) -> tuple[str, dict[str, Any]]:
        outcomes = await asyncio.gather(*(self._race(r) for r in range(self.rounds)))
        bad = [o for o in outcomes if o["problem"]]
        details = {
            "strategy": self.storage.strategy,
            "rounds": self.rounds,
            "writers": self.writers,
            "attempts": self.rounds * self.writers,
            "rounds_with_several_winners": sum(len(o["winners"]) > 1 for o in outcomes),
            "rounds_overwritten": sum(o["overwritten"] for o in outcomes),
        }
        if bad:
            first = bad[0]
            raise _Violation(
                f"{len(bad)} of {self.rounds} races broke put-if-absent (strategy "
                f"{self.storage.strategy}): {first['problem']}. Two writers that both believe they "
                "created a segment or a cursor delta fork the log: messages are lost or delivered "
                "twice. Do not use this store as it is (docs/operations.md, 'Checking your store')",
                **details,
                examples=[o["problem"] for o in bad[:3]],
            )
        return (
            f"{self.rounds} rounds of {self.writers} racing writers: one winner each, its bytes kept",
            details,
        )

    async def _race(self, round_no: int) -> dict[str, Any]:
        key = self.key(f"race/{round_no:03d}")
        start = asyncio.Event()

        async def writer(w: int) -> tuple[int, str]:
            data = _race_body(w, round_no)
            await start.wait()
            for _ in range(CONTENDED_RETRIES):
                try:
                    await self.storage.create(key, data)
                    return w, "won"
                except AlreadyExists:
                    return w, "lost"
                except Contended:
                    await asyncio.sleep(0.2)
            return w, "contended"

        tasks = [asyncio.create_task(writer(w)) for w in range(self.writers)]
        await asyncio.sleep(0)  # every writer waits at the start line
        start.set()
        results = await asyncio.gather(*tasks)
        winners = [w for w, outcome in results if outcome == "won"]
        blob = await self.store.get(key)
        held = _race_writer(blob.data) if blob is not None else None
        problem = ""
        overwritten = False
        if len(winners) > 1:
            problem = f"{len(winners)} writers of one key were all told they created it (writers {winners})"
        if len(winners) == 1 and held != winners[0]:
            overwritten = True
            problem = problem or f"the winner (writer {winners[0]}) was overwritten by writer {held}"
        if winners and held is None:
            problem = problem or "a writer was told it created the key, which does not exist"
        return {"winners": winners, "overwritten": overwritten, "problem": problem}

    async def if_match(self) -> tuple[str, dict[str, Any]]:
        key = self.key("if-match")
        first = await self.store.put(key, b"version 1")
        second = await self.store.put(key, b"version 2", if_match=first)
        if second == first:
            raise _Violation("an overwrite with If-Match kept the ETag: ETags do not identify versions")
        try:
            await self.store.put(key, b"stale version", if_match=first)
        except PreconditionFailed:
            pass
        else:
            raise _Violation(
                "a PUT with a stale If-Match ETag overwrote the object: conditional updates "
                "(head hints, trims) can silently undo another writer's"
            )
        try:
            await self.store.put(self.key("if-match-missing"), b"x", if_match=first)
        except PreconditionFailed:
            pass
        else:
            raise _Violation("a PUT with If-Match created an object that did not exist")
        try:
            await self.store.put(key, b"again", if_none_match=True)
        except AlreadyExists:
            pass
        except PreconditionFailed:
            pass
        else:
            raise _Violation("a PUT with If-None-Match: * overwrote an existing object")
        blob = await self.store.get(key)
        if blob is None or blob.data != b"version 2":
            raise _Violation(
                "a refused conditional PUT changed the object",
                held=None if blob is None else blob.data.decode(errors="replace"),
            )
        return "a stale or missing If-Match ETag and If-None-Match on an existing key are refused", {}

    async def read_after_write(self) -> tuple[str, dict[str, Any]]:
        for i in range(READ_ROUNDS):
            key = self.key(f"read/{i:03d}")
            for version in (1, 2):
                data = f"{key} version {version}".encode()
                etag = await self.store.put(key, data)
                blob = await self.store.get(key)
                if blob is None:
                    raise _Violation(f"a GET right after a PUT found nothing (round {i}, version {version})")
                if blob.data != data:
                    raise _Violation(
                        f"a GET right after a PUT returned older bytes (round {i}, version {version})",
                        expected=data.decode(),
                        got=blob.data.decode(errors="replace"),
                    )
                info = await self.store.head(key)
                if info is None or info.etag != etag:
                    raise _Violation(
                        f"a HEAD right after a PUT did not see it (round {i}, version {version})"
                    )
            await self.store.delete([key])
            if await self.store.get(key) is not None:
                raise _Violation(f"a GET right after a DELETE still found the object (round {i})")
        return f"{READ_ROUNDS} keys written twice and deleted: every GET and HEAD saw the last write", {}

    async def list_after_write(self) -> tuple[str, dict[str, Any]]:
        prefix = self.key("list/")
        keys = [f"{prefix}{i:04d}" for i in range(LIST_KEYS)]
        await asyncio.gather(*(self.store.put(k, b"listed") for k in keys))
        listed = [info.key async for info in self.store.list(prefix)]
        missing = sorted(set(keys) - set(listed))
        if missing:
            raise _Violation(
                f"a LIST right after {LIST_KEYS} PUTs missed {len(missing)} of them: a reader can "
                "miss new segments or cursor deltas",
                missing=missing[:5],
            )
        if listed != sorted(listed):
            raise _Violation("a LIST returned keys out of order", listed=listed[:10])
        await self.store.delete(keys)
        left = [info.key async for info in self.store.list(prefix)]
        if left:
            raise _Violation(f"a LIST right after a DELETE still showed {len(left)} keys", left=left[:5])
        return f"{LIST_KEYS} keys listed right after their PUTs, none after their DELETE", {}

    async def clock(self) -> tuple[str, dict[str, Any]]:
        key = self.key("clock")
        before = self.now()
        await self.store.put(key, b"what time is it")
        after = self.now()
        info = await self.store.head(key)
        if info is None:
            raise _Violation("the object written to read the store's clock is gone")
        store_time = info.last_modified
        # The store stamped the object at some host time in [before, after], on its own clock,
        # perhaps truncated to the second: store_time is in [before + skew - 1, after + skew], so
        # the skew (store clock minus host clock) is in [low, high]. Only a skew surely beyond
        # the tolerance fails.
        low = store_time - after
        high = store_time - before + LAST_MODIFIED_RESOLUTION_S
        details = {
            "offset_s": round((low + high) / 2, 3),
            "offset_range_s": [round(low, 3), round(high, 3)],
            "tolerance_s": self.clock_tolerance_s,
            "store_time": store_time,
            "host_time": round(after, 3),
        }
        if low > self.clock_tolerance_s or high < -self.clock_tolerance_s:
            surely = low if low > 0 else -high
            relation = "behind" if low > 0 else "ahead of"
            raise _Violation(
                f"the host clock is at least {surely:.1f}s {relation} the store's (tolerance "
                f"{self.clock_tolerance_s:g}s): fix the host's time sync (NTP) before running "
                "bucketq here",
                **details,
            )
        return (
            f"host and store clocks agree within {self.clock_tolerance_s:g}s "
            f"(offset {low:+.1f}s to {high:+.1f}s)",
            details,
        )


def _race_body(writer: int, round_no: int) -> bytes:
    """What ``writer`` puts in a race: its name, padded to the size of a small segment (a store
    that checks the condition before it takes in the body races over the upload)."""
    return f"writer {writer} of round {round_no}\n".encode().ljust(RACE_BODY_BYTES, b".")


def _race_writer(data: bytes) -> int | None:
    head = data.split(b"\n", 1)[0].split()
    return int(head[1]) if len(head) >= 2 and head[0] == b"writer" and head[1].isdigit() else None


async def check_store(
    storage: Storage,
    root: str = "",
    *,
    writers: int = DEFAULT_WRITERS,
    rounds: int = DEFAULT_ROUNDS,
    clock_tolerance_s: float = DEFAULT_CLOCK_TOLERANCE_S,
) -> StoreReport:
    """Run every check on ``storage`` under ``{root}/_doctor/``; see the module's docstring."""
    checks = StoreChecks(storage, root, writers=writers, rounds=rounds, clock_tolerance_s=clock_tolerance_s)
    return await checks.run_all()
