"""Parameters of a bench invocation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bucketq.bench.backends import BackendName

ScenarioName = Literal["publish", "consume", "e2e", "latency"]
SCENARIOS: tuple[ScenarioName, ...] = ("publish", "consume", "e2e", "latency")


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
    tuning: dict[str, Any] = field(default_factory=dict)  # Settings fields, e.g. {"producer": {...}}

    def __post_init__(self) -> None:
        for name in ("messages", "producers", "consumers", "partitions", "window", "poll_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.payload_bytes < 0:
            raise ValueError("payload_bytes must not be negative")
        if self.latency_rate <= 0 or self.latency_messages < 1:
            raise ValueError("latency_rate and latency_messages must be positive")
