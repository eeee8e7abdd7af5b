"""The wake pings' network in the simulation: the engine's ``PingNetwork`` port over a seeded,
lossy, reordering network on virtual time (core/pings.py, invariant I14).

Each schedule draws how the network misbehaves: a share of pings lost (all of them in some runs:
pickup then rests on the wake poll), delays up to seconds (a ping may arrive after the member's
own look, or after a crash of its sender), duplicates, and forged pings (a ping for a random
topic of the run, or garbage bytes, delivered to a random member that listens). None of this may
change what the checker sees: pings decide nothing.

Rings (the doorbell, version 2) travel the same network: producers ring on every append, and
rings are lost, delayed, duplicated and replayed like pings; forgeries include rings naming a
random partition and a sequence number around the ones rung (segments that exist, were read
long ago, or do not exist yet).

Invariants of this adapter: a datagram is delivered in the receiving process (its callbacks are
held while that process is paused, never run once it crashed), never in the sender's; its
draws come from generators of its own (the store's draw no number for it).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from bucketq.core.pings import parse_ring, ping_payload, ring_payload

from .process import CURRENT, SimProcess


@dataclass(frozen=True)
class PingFaults:
    loss: float
    max_delay_s: float
    duplicate: float
    forge: float

    @classmethod
    def draw(cls, seed: int) -> PingFaults:
        rng = random.Random(f"pings/{seed}")
        return cls(
            loss=rng.choice([0.0, 0.0, 0.3, 1.0]),
            max_delay_s=rng.choice([0.002, 0.2, 5.0]),
            duplicate=rng.choice([0.0, 0.2]),
            forge=rng.choice([0.0, 0.3]),
        )


@dataclass(eq=False)
class _Endpoint:
    address: str
    receive: Callable[[bytes], None]
    proc: SimProcess | None
    context: contextvars.Context
    closed: bool = False


class SimPingNetwork:
    """One run's network: hands out endpoints (one per ``Bucketq`` connection) that implement
    the ``PingNetwork`` port."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seed: int, injected: Counter[str]) -> None:
        self.loop = loop
        self.faults = PingFaults.draw(seed)
        self.rng = random.Random(f"ping-network/{seed}")
        self.injected = injected
        self._endpoints: dict[str, _Endpoint] = {}
        self._wake_keys: list[bytes] = []  # payloads seen, for forgeries
        self._rung: list[tuple[str, int]] = []  # (wake key, seq) of rings seen, for forged rings

    def endpoint(self) -> SimPingEndpoint:
        return SimPingEndpoint(self)

    def open(self, receive: Callable[[bytes], None]) -> str:
        address = f"udp://10.0.{len(self._endpoints) // 250}.{len(self._endpoints) % 250 + 1}:7470"
        # captured now, in the opening process: deliveries run as that process
        self._endpoints[address] = _Endpoint(address, receive, CURRENT.get(), contextvars.copy_context())
        return address

    def close(self, address: str) -> None:
        endpoint = self._endpoints.get(address)
        if endpoint is not None:
            endpoint.closed = True

    def send(self, address: str, payload: bytes) -> None:
        f = self.faults
        if payload not in self._wake_keys:
            self._wake_keys.append(payload)
        ring = parse_ring(payload)
        if ring is not None:
            self.injected["ring_sent"] += 1
            if (ring.wake_key, ring.seq) not in self._rung:
                self._rung.append((ring.wake_key, ring.seq))
        if self.rng.random() < f.loss:
            self.injected["ping_lost"] += 1
        else:
            self._deliver_later(address, payload)
        if self.rng.random() < f.duplicate:
            self.injected["ping_duplicated"] += 1
            self._deliver_later(address, payload)
        if self.rng.random() < f.forge and self._endpoints:
            self.injected["ping_forged"] += 1
            target = self.rng.choice(sorted(self._endpoints))
            forged = self.rng.choice(
                [
                    *self._wake_keys,
                    ping_payload("no-such-topic/.wake"),
                    b"\x00garbage",
                    b"",
                    self._forged_ring(),
                ]
            )
            self._deliver_later(target, forged)

    def _forged_ring(self) -> bytes:
        """A ring for a random partition (0-7: some do not exist) naming a sequence number near
        one rung: a segment that exists, was read long ago, or is not written yet."""
        if not self._rung:
            return ring_payload("no-such-topic/.wake", 0, 0)
        key, seq = self.rng.choice(self._rung)
        return ring_payload(key, self.rng.randrange(8), max(0, seq + self.rng.randint(-3, 5)))

    def _deliver_later(self, address: str, payload: bytes) -> None:
        endpoint = self._endpoints.get(address)
        if endpoint is None:
            return  # no one there: the datagram is lost
        delay = self.rng.uniform(0.0, self.faults.max_delay_s)
        self.loop.call_later(delay, self._deliver, endpoint, payload, context=endpoint.context)

    def _deliver(self, endpoint: _Endpoint, payload: bytes) -> None:
        if endpoint.closed or (endpoint.proc is not None and not endpoint.proc.alive):
            return  # a closed socket, a dead process: nothing receives it
        self.injected["ring_delivered" if parse_ring(payload) is not None else "ping_delivered"] += 1
        endpoint.receive(payload)


class SimPingEndpoint:
    """One connection's socket on the simulated network (the ``PingNetwork`` port)."""

    def __init__(self, network: SimPingNetwork) -> None:
        self.network = network
        self.address: str | None = None

    async def open(self, receive: Callable[[bytes], None]) -> str | None:
        self.address = self.network.open(receive)
        return self.address

    def send(self, address: str, payload: bytes) -> None:
        if self.address is not None:
            self.network.send(address, payload)

    def close(self) -> None:
        if self.address is not None:
            self.network.close(self.address)
