"""Parameters of a bench invocation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bucketq.bench.backends import BackendName

ScenarioName = Literal["publish", "consume", "e2e", "latency", "idle", "cost", "awaited", "one-at-a-time"]
# What a bare ``bucketq bench`` runs; the billing scenarios (idle, cost, awaited) take minutes and
# run when named.
SCENARIOS: tuple[ScenarioName, ...] = ("publish", "consume", "e2e", "latency")
ALL_SCENARIOS: tuple[ScenarioName, ...] = (*SCENARIOS, "idle", "cost", "awaited", "one-at-a-time")
# What ``--via sidecar`` runs through the params (each on its own): the rest of --via sidecar is
# the e2e run of bench/sidecar.py
VIA_SIDECAR: tuple[ScenarioName, ...] = ("idle", "one-at-a-time")
DEFAULT_RATES: tuple[float, ...] = (1.0, 10.0, 50.0, 500.0, 5000.0)


@dataclass
class BenchParams:
    """What to run and how big. Every scenario runs in a fresh bucket and a fresh topic."""

    backend: BackendName = "memory"
    scenarios: list[ScenarioName] = field(default_factory=lambda: list(SCENARIOS))
    messages: int = 10_000
    producers: int = 4
    consumers: int = 4
    partitions: int = 4
    payload_bytes: int = 200
    window: int = 1000  # publishes pending per producer (unthrottled scenarios)
    poll_batch: int = 500  # messages asked per poll
    latency_rate: float = 50.0  # msgs/s of the latency scenario
    latency_messages: int = 500  # at most this many messages in the latency scenario
    idle_timeout_s: float = 60.0  # give up (and count losses) after this long without progress
    warmup_s: float = 1.0  # consumers poll an empty topic this long before the latency run starts
    grace_s: float = 0.5  # keep consuming after the last ack, to catch late duplicates
    tuning: dict[str, Any] = field(default_factory=dict)  # Settings fields, e.g. {"profile": "economy"}
    # idle: each member count idles idle_seconds, of which the first idle_warmup_s are not measured;
    # then `pickups` times: silence_s without publishing, one message, its delivery
    idle_seconds: float = 120.0
    idle_warmup_s: float = 15.0
    silence_s: float = 60.0
    pickups: int = 5
    # cost: open-loop publishing at each rate for rate_seconds (at most `messages` messages)
    rates: list[float] = field(default_factory=lambda: list(DEFAULT_RATES))
    rate_seconds: float = 30.0
    # awaited: this many tasks share one producer, each awaiting its own publish
    tasks: int = 8
    # one-at-a-time: this many messages, each published a random 0..one_max_gap_ms after the
    # previous one arrived (gaps drawn from one_seed), by a publisher in another process; with
    # compare, pawn-queue runs the same conversation on the same server; one_push adds the
    # sidecar's push delivery to its pull (--via sidecar)
    one_messages: int = 100
    one_max_gap_ms: float = 100.0
    one_seed: int = 0
    compare: bool = True
    one_push: bool = True
    # idle and one-at-a-time: the members are library connections, or sidecar processes whose
    # apps long-poll /v1/pull (moto and SeaweedFS only: the sidecars are processes of their own)
    via: Literal["library", "sidecar"] = "library"
    # memory only: serve the store one request at a time, each taking this long (bench/served.py)
    service_ms: float | None = None
    service_servers: int = 1  # ... this many at a time

    def __post_init__(self) -> None:
        for name in (
            "messages",
            "producers",
            "consumers",
            "partitions",
            "window",
            "poll_batch",
            "pickups",
            "tasks",
            "one_messages",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.payload_bytes < 0:
            raise ValueError("payload_bytes must not be negative")
        if self.latency_rate <= 0 or self.latency_messages < 1:
            raise ValueError("latency_rate and latency_messages must be positive")
        if self.idle_warmup_s < 0 or self.idle_seconds <= self.idle_warmup_s:
            raise ValueError("idle_seconds must be longer than idle_warmup_s (which must not be negative)")
        if self.silence_s < 0:
            raise ValueError("silence_s must not be negative")
        if not self.rates or any(rate <= 0 for rate in self.rates):
            raise ValueError("rates must be one or more positive msgs/s")
        if self.rate_seconds <= 0:
            raise ValueError("rate_seconds must be positive")
        if self.service_ms is not None and (self.service_ms < 0 or self.backend != "memory"):
            raise ValueError("service_ms models a server on the memory backend and must not be negative")
        if self.via == "sidecar" and (
            self.backend not in ("moto", "seaweedfs") or self.scenarios not in [[s] for s in VIA_SIDECAR]
        ):
            raise ValueError(
                "via sidecar runs the idle or the one-at-a-time scenario alone, on moto or seaweedfs"
            )
        if "one-at-a-time" in self.scenarios and self.backend == "memory":
            raise ValueError("one-at-a-time publishes from another process: it needs moto, seaweedfs or file")
        if self.one_max_gap_ms < 0:
            raise ValueError("one_max_gap_ms must not be negative")
        if self.service_servers < 1 or (self.service_servers > 1 and self.service_ms is None):
            raise ValueError("service_servers must be at least 1, and more than 1 only with service_ms")

    @property
    def profile(self) -> str | None:
        """The engine profile asked for (None: the engine's default)."""
        value = self.tuning.get("profile")
        return None if value is None else str(value)
