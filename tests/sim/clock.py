"""Virtual time: an asyncio loop whose clock jumps to the next timer, and the patched time sources.

Invariants this module keeps:

* Nothing in a simulation waits for real time. The loop's selector never blocks: asked to wait
  ``timeout`` seconds, it advances the virtual clock by ``timeout`` and reports no I/O (the
  in-memory store needs none). A loop with nothing ready and no timer pending is a deadlock
  (:class:`SimDeadlock`), never a hang.
* ``time.time``/``time.monotonic``/``time.perf_counter`` (and their ``_ns`` forms) read the
  virtual clock while a simulation runs, shifted by the calling process's skew, and are restored
  afterwards. Loop timers use the unskewed clock (one machine, one timer wheel).
* Every source of randomness the engine uses (``random``, ``secrets``, ``uuid4``, ``uuid7``) is
  seeded from the schedule's seed for the run and restored afterwards, so a seed replays exactly.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import random
import secrets
import selectors
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import uuid6

# The virtual wall clock at t=0. Fixed, so that timestamps in objects (and their hashes) replay.
EPOCH = 1_800_000_000.0
# monotonic() at t=0: far from 0 so that code subtracting a "never" of 0.0 behaves as in production.
MONOTONIC_BASE = 100_000.0
# The shortest timer: real time advances by at least this much before a timer fires.
MIN_TIMER_S = 1e-6


# The module-level functions of ``random`` (bound methods of its hidden shared instance).
_RANDOM_FUNCTIONS = (
    "random",
    "uniform",
    "randint",
    "randrange",
    "choice",
    "choices",
    "shuffle",
    "sample",
    "getrandbits",
    "randbytes",
    "gauss",
    "normalvariate",
    "expovariate",
    "triangular",
    "betavariate",
    "lognormvariate",
)


class SimDeadlock(RuntimeError):
    """Nothing is runnable and no timer is pending: the awaited result can never arrive."""


class VirtualClock:
    """Seconds since the start of the simulation; only the loop's selector advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.now += seconds


def _fileno(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class VirtualSelector(selectors.BaseSelector):
    """A selector that never blocks: waiting ``timeout`` seconds advances the virtual clock.

    It keeps registrations (the loop registers its self-pipe) but never reports them ready:
    the simulation uses no real I/O, and nothing calls the loop from another thread.
    """

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fileno(fileobj), events, data)
        self._keys[key.fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(_fileno(fileobj))

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        try:
            return self._keys[_fileno(fileobj)]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimDeadlock("no task is runnable and no timer is pending")
        self._clock.advance(timeout)
        return []

    def close(self) -> None:
        self._keys.clear()


class SimLoop(asyncio.SelectorEventLoop):
    """The simulation's event loop: FIFO ready queue, timers on the virtual clock."""

    def __init__(self, clock: VirtualClock, selector: VirtualSelector | None = None) -> None:
        self.clock = clock
        # When the code of the current context may run again (a stopped process's); set by the
        # process registry. Every callback is checked when it is about to run, so a stopped
        # process's tasks, timers and future callbacks all wait, as under SIGSTOP.
        self.frozen_until: Callable[[], float] | None = None
        super().__init__(selector if selector is not None else VirtualSelector(clock))

    def time(self) -> float:
        return self.clock.now

    def _run_held(self, context: contextvars.Context, callback: Callable[..., Any], *args: Any) -> None:
        until = self.frozen_until() if self.frozen_until is not None else 0.0
        if until > self.clock.now:
            # still stopped: run it when the process continues, in the very same context object
            # (a copy would break a task whose code set a context variable and resets it later:
            # a token resets only in the context that made it)
            asyncio.SelectorEventLoop.call_at(
                self, until, self._run_held, context, callback, *args, context=context
            )
            return
        callback(*args)

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        if self.frozen_until is not None:
            context = context if context is not None else contextvars.copy_context()
            return super().call_soon(self._run_held, context, callback, *args, context=context)
        return super().call_soon(callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        # Real time always moves on: a timer is never due "now" (within the loop's clock resolution).
        # Without this, code that waits for ``deadline - now`` seconds while that is a few ulps above
        # zero (``wait_for(..., 1e-13)``) spins forever without the clock advancing.
        when = max(when, self.clock.now + MIN_TIMER_S)
        if self.frozen_until is not None:
            context = context if context is not None else contextvars.copy_context()
            return super().call_at(when, self._run_held, context, callback, *args, context=context)
        return super().call_at(when, callback, *args, context=context)


@contextmanager
def virtual_time(clock: VirtualClock, skew: Callable[[], float]) -> Iterator[None]:
    """Patch the ``time`` module to read ``clock`` (wall time shifted by ``skew()``) for the block.

    ``skew()`` is asked on every call, so each simulated process reads its own skewed clock
    (it looks the calling process up in a context variable).
    """
    saved = (
        time.time,
        time.time_ns,
        time.monotonic,
        time.monotonic_ns,
        time.perf_counter,
        time.perf_counter_ns,
    )

    sim_thread = threading.get_ident()
    real_time, real_time_ns, real_mono, real_mono_ns, real_perf, real_perf_ns = saved

    # Another thread in the interpreter (one a test left running) keeps the real clock: its
    # timeouts stay real, and nothing it does can depend on the simulation's clock.
    def wall() -> float:
        if threading.get_ident() != sim_thread:
            return real_time()
        return EPOCH + clock.now + skew()

    def mono() -> float:
        if threading.get_ident() != sim_thread:
            return real_mono()
        return MONOTONIC_BASE + clock.now

    def wall_ns() -> int:
        return int(wall() * 1e9) if threading.get_ident() == sim_thread else real_time_ns()

    def mono_ns() -> int:
        return int(mono() * 1e9) if threading.get_ident() == sim_thread else real_mono_ns()

    def perf() -> float:
        return mono() if threading.get_ident() == sim_thread else real_perf()

    def perf_ns() -> int:
        return int(mono() * 1e9) if threading.get_ident() == sim_thread else real_perf_ns()

    time.time = wall
    time.time_ns = wall_ns
    time.monotonic = mono
    time.monotonic_ns = mono_ns
    time.perf_counter = perf
    time.perf_counter_ns = perf_ns
    # defaults like ``clock: Callable[[], float] = time.time`` captured the real clock at import
    rebound = _rebind_defaults(dict(zip(saved, (wall, wall_ns, mono, mono_ns, perf, perf_ns), strict=True)))
    try:
        yield
    finally:
        (
            time.time,
            time.time_ns,
            time.monotonic,
            time.monotonic_ns,
            time.perf_counter,
            time.perf_counter_ns,
        ) = saved
        for func, attr, value in rebound:
            setattr(func, attr, value)


def _engine_functions() -> Iterator[Any]:
    """Every function and method defined in the engine's modules."""
    for name, module in list(sys.modules.items()):
        if not (name == "bucketq" or name.startswith("bucketq.")) or module is None:
            continue
        for obj in list(vars(module).values()):
            if getattr(obj, "__module__", None) != name:
                continue
            if inspect.isfunction(obj):
                yield obj
            elif inspect.isclass(obj):
                for member in vars(obj).values():
                    func = getattr(member, "__func__", member)
                    if inspect.isfunction(func):
                        yield func


def _rebind_defaults(replace: dict[Any, Any]) -> list[tuple[Any, str, Any]]:
    """Swap default argument values found in ``replace``; return what to restore."""
    undo: list[tuple[Any, str, Any]] = []
    for func in _engine_functions():
        if func.__defaults__ and any(_is_in(d, replace) for d in func.__defaults__):
            undo.append((func, "__defaults__", func.__defaults__))
            func.__defaults__ = tuple(replace[d] if _is_in(d, replace) else d for d in func.__defaults__)
        kw = func.__kwdefaults__
        if kw and any(_is_in(v, replace) for v in kw.values()):
            undo.append((func, "__kwdefaults__", dict(kw)))
            func.__kwdefaults__ = {k: replace[v] if _is_in(v, replace) else v for k, v in kw.items()}
    return undo


def _is_in(value: Any, table: dict[Any, Any]) -> bool:
    try:
        return value in table
    except TypeError:  # unhashable default
        return False


@contextmanager
def seeded_entropy(seed: int) -> Iterator[random.Random]:
    """Seed ``random`` and replace ``secrets``/``uuid4``/``uuid7`` with generators drawn from ``seed``.

    Yields the generator behind the replacements (the simulation's own decisions use separate
    generators, so that adding an engine call does not shift every fault).

    Only the simulation's thread draws from the seeded generators: a thread left running by
    something else in the same interpreter (an HTTP client's pool, a server of an earlier test)
    that calls ``random`` or ``uuid4`` keeps its own, so it cannot shift a seed's history.
    """
    rng = random.Random(f"entropy/{seed}")
    module_rng = random.Random(seed)  # what ``random.seed(seed)`` gives the simulation's thread
    sim_thread = threading.get_ident()
    saved = (secrets.token_hex, secrets.token_bytes, secrets.randbits, uuid.uuid4, uuid6.uuid7)
    saved_random = {name: getattr(random, name) for name in _RANDOM_FUNCTIONS}
    last_ms = [0]

    def on_sim_thread() -> bool:
        return threading.get_ident() == sim_thread

    def token_bytes(nbytes: int | None = None) -> bytes:
        if not on_sim_thread():
            return saved[1](nbytes)
        return rng.randbytes(32 if nbytes is None else nbytes)

    def token_hex(nbytes: int | None = None) -> str:
        if not on_sim_thread():
            return saved[0](nbytes)
        return token_bytes(nbytes).hex()

    def randbits(k: int) -> int:
        return rng.getrandbits(k) if on_sim_thread() else saved[2](k)

    def uuid4() -> uuid.UUID:
        if not on_sim_thread():
            return saved[3]()
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    def uuid7() -> uuid.UUID:
        if not on_sim_thread():
            return saved[4]()
        # time-ordered like uuid6.uuid7 (milliseconds of the virtual clock, strictly increasing)
        ms = max(time.time_ns() // 1_000_000, last_ms[0] + 1)
        last_ms[0] = ms
        return uuid6.UUID(int=((ms & 0xFFFFFFFFFFFF) << 80) | rng.getrandbits(76), version=7)

    def per_thread(name: str) -> Callable[..., Any]:
        seeded, shared = getattr(module_rng, name), saved_random[name]

        def draw(*args: Any, **kwargs: Any) -> Any:
            return (seeded if on_sim_thread() else shared)(*args, **kwargs)

        return draw

    for name in _RANDOM_FUNCTIONS:
        setattr(random, name, per_thread(name))
    secrets.token_hex = token_hex
    secrets.token_bytes = token_bytes
    secrets.randbits = randbits
    uuid.uuid4 = uuid4
    uuid6.uuid7 = uuid7  # type: ignore[assignment]
    try:
        yield rng
    finally:
        for name, func in saved_random.items():
            setattr(random, name, func)
        secrets.token_hex, secrets.token_bytes, secrets.randbits, uuid.uuid4, uuid6.uuid7 = saved
