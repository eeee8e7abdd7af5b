"""Scaling signals: ``pending`` (backlog + in flight), lease holders, KEDA's ``/scaling`` endpoint and
``bucketq_build_info``, with the real engine on a moto server (and the in-memory store for the
simulated scale-in run), the operator against the Kubernetes emulator.
"""

from __future__ import annotations

import asyncio
import math
import platform
import random
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketq import __version__
from bucketq.config import Settings
from bucketq.core.app import FORMAT, Bucketq
from bucketq.core.consumer import Consumer
from bucketq.core.keys import namespace_root
from bucketq.core.message import Message
from bucketq.operator.metrics import QueueMetrics
from bucketq.operator.scaling import desired_replicas
from bucketq.operator.topics import topic_figures
from bucketq.storage import MemoryStore
from tests.operator.harness import Kube, RunningOperator, eventually
from tests.operator.test_consumers import consumer as consumer_resource
from tests.operator.test_topics import ready, topic
from tests.support.engine_helpers import Backend
from tests.support.servers import S3Server, free_ports

T = TypeVar("T")
LEASE_S = 120.0  # no lease runs out during a test


# -- helpers ---------------------------------------------------------------------------------------------


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        assert resp.content_type == "application/json", f"{url} answered {resp.content_type}"
        return resp.status, await resp.json()


async def samples(session: aiohttp.ClientSession, port: int) -> dict[tuple[str, frozenset[Any]], float]:
    """Every sample of the operator's /metrics: (name, labels) -> value."""
    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sub_labels(ns: str, topic_name: str, consumer: str) -> frozenset[Any]:
    return frozenset({"namespace": ns, "topic": topic_name, "consumer": consumer}.items())


async def poll_n(member: Consumer, count: int, timeout: float = 20.0) -> list[Message]:
    """Exactly ``count`` messages delivered by ``member`` (fails when fewer arrive in time)."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"got {len(out)} of {count} messages within {timeout:g}s"
        out += await member.poll(max_messages=count - len(out), wait=0.2)
    return out


async def _true(value: bool) -> bool:
    return value


async def leases_with_prefetch(member: Consumer, delivered: int) -> int:
    """Wait until ``member`` also holds prefetched messages beyond the ``delivered`` ones, stop its
    claiming and return how many leases it holds once no claim is in progress."""
    await eventually(
        lambda: _true(member.in_flight > delivered), "the member to prefetch beyond what it delivered", 20
    )
    member.pause()
    return (await quiescent([member]))[member.member]


@pytest.fixture
async def served_metrics() -> AsyncIterator[tuple[QueueMetrics, int]]:
    """A :class:`QueueMetrics` serving /metrics and /scaling on a free port (as the operator does)."""
    metrics = QueueMetrics()
    (port,) = free_ports(1)
    runner = await metrics.serve("127.0.0.1", port)
    try:
        yield metrics, port
    finally:
        await runner.cleanup()


# -- the formula -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "holders", "per_replica", "activation", "replicas"),
    [
        (0, 0, 100, 0, 0),  # nothing to do: scale to zero
        (1, 0, 100, 0, 1),  # one message wakes a replica
        (1, 1, 100, 0, 1),  # the last leased message keeps its holder
        (3, 3, 100, 0, 3),  # few messages, three holders: never below the holders
        (250, 1, 100, 0, 3),  # the backlog wants more
        (250, 5, 100, 0, 5),
        (5, 0, 100, 5, 0),  # at or below the activation threshold, nobody leasing
        (6, 0, 100, 5, 1),
        (2, 2, 100, 5, 2),  # holders win over activation
    ],
)
def test_desired_replicas(
    pending: int, holders: int, per_replica: int, activation: int, replicas: int
) -> None:
    assert desired_replicas(pending, holders, per_replica, activation) == replicas


def test_desired_replicas_rejects_a_zero_divisor() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        desired_replicas(1, 0, 0)


# -- pending and holders from the engine (moto server) --------------------------------------------------


async def test_leased_messages_are_pending_and_not_backlog(moto_server: S3Server) -> None:
    settings = moto_server.settings(strategy="conditional_write")
    async with Bucketq(settings) as bq:
        await bq.create_topic("orders", partitions=2)
        for i in range(12):
            await bq.publish("orders", {"n": i}, key=f"k{i}")
        await bq.init_subscription("orders", "billing")
        (before,) = await bq.stats("orders", "billing")
        assert (before.pending, before.backlog, before.in_flight, before.holders) == (12, 12, 0, [])

        async with Bucketq(settings) as worker_bq:
            member = await worker_bq.register_consumer(
                "billing", "orders", max_in_flight=5, visibility_timeout_s=LEASE_S
            )
            delivered = await poll_n(member, 2)
            leased = await leases_with_prefetch(member, 2)  # delivered + prefetched: all leased
            (stats,) = await bq.stats("orders", "billing")
            assert stats.in_flight == leased and 2 < leased <= 5
            assert stats.backlog == 12 - leased and stats.pending == 12
            assert stats.holders == [member.member]
            assert sum(p.pending for p in stats.partitions) == 12
            assert stats.to_json()["pending"] == 12

            for msg in delivered:
                await msg.ack()
            (after,) = await bq.stats("orders", "billing")
            assert (after.pending, after.in_flight, after.backlog) == (10, leased - 2, 12 - leased)
            await member.close()  # gives every lease back
        (closed,) = await bq.stats("orders", "billing")
        assert (closed.pending, closed.in_flight, closed.backlog, closed.holders) == (10, 0, 10, [])


# -- the endpoint against the operator (emulator + moto) ------------------------------------------------


async def test_scaling_endpoint_and_pending_metric_from_the_operator(
    kube: Kube,
    shared_ns: str,
    shared_engine: Settings,
    shared_ports: dict[str, int],
    shared_operator: RunningOperator,
) -> None:
    ns, port = shared_ns, shared_ports["metrics"]
    kube.create(topic(ns, "orders", partitions=2))
    kube.create(consumer_resource(ns, "billing", topics=["orders"]))
    await eventually(
        lambda: _true(ready(kube, "consumers", ns, "billing") is not None), "Consumer billing to be Ready"
    )
    settings = shared_engine.model_copy(update={"root": namespace_root(shared_engine.root, ns)})
    base = f"http://127.0.0.1:{port}/scaling/{ns}/billing"
    async with aiohttp.ClientSession() as session, Bucketq(settings) as bq:
        for i in range(12):
            await bq.publish("orders", {"n": i}, key=f"k{i}")
        member = await bq.register_consumer(
            "billing", "orders", max_in_flight=5, visibility_timeout_s=LEASE_S
        )
        delivered = await poll_n(member, 2)
        leased = await leases_with_prefetch(member, 2)

        async def shows_leases() -> dict[str, Any] | None:
            # from this operator's topic refresh, which also feeds /metrics: the Consumer's status
            # timer can persist the same figures first, and the endpoint answers from them
            # ("source": "status") before the topic's snapshot holds the subscription
            status, body = await get_json(session, base)
            fresh = status == 200 and body["source"] == "refresh"
            return body if fresh and body["inFlight"] == leased else None

        body = await eventually(shows_leases, f"the endpoint to show {leased} leased messages")
        assert (body["pending"], body["backlog"]) == (12, 12 - leased)
        assert body["holders"] == 1 and body["leaseHolders"] == [member.member]
        assert body["replicas"] == 1 and body["messagesPerReplica"] == 100
        assert body["topics"]["orders"]["pending"] == 12
        assert 0 <= body["ageSeconds"] < 30
        status, body = await get_json(session, base + "?messagesPerReplica=5")
        assert (status, body["replicas"]) == (200, 3)  # ceil(12 / 5)
        status, body = await get_json(session, base + "?topic=orders&activation=20")
        assert (status, body["replicas"]) == (200, 1), "a holder keeps its replica whatever the activation"

        # the same figures in /metrics, pending = backlog + in flight
        labels = sub_labels(ns, "orders", "billing")
        found = await samples(session, port)
        assert found[("bucketq_subscription_pending", labels)] == 12
        assert found[("bucketq_subscription_in_flight", labels)] == leased
        assert found[("bucketq_subscription_backlog", labels)] == 12 - leased
        consumer_labels = frozenset({"namespace": ns, "consumer": "billing"}.items())
        assert found[("bucketq_consumer_lease_holders", consumer_labels)] == 1

        for msg in delivered:
            await msg.ack()
        await member.close()

        async def released() -> dict[str, Any] | None:
            status, body = await get_json(session, base)
            return body if status == 200 and body["pending"] == 10 and body["holders"] == 0 else None

        body = await eventually(released, "the endpoint to show the acks and the released leases")
        assert (body["inFlight"], body["backlog"], body["replicas"]) == (0, 10, 1)
        status, body = await get_json(session, base + "?activation=10")
        assert (status, body["replicas"]) == (200, 0), "10 waiting, none leased: not above activation"
        found = await samples(session, port)
        assert found[("bucketq_consumer_lease_holders", consumer_labels)] == 0
        assert found[("bucketq_subscription_pending", labels)] == 10

        # failures: JSON errors KEDA logs, never a crash or an HTML page
        for url, code, needle in (
            (f"http://127.0.0.1:{port}/scaling/{ns}/nobody", 404, "consumer_not_found"),
            (f"http://127.0.0.1:{port}/scaling/no-such-ns/billing", 404, "consumer_not_found"),
            (base + "?topic=other", 404, "topic_not_found"),
            (base + "?messagesPerReplica=0", 400, "bad_parameter"),
            (base + "?messagesPerReplica=lots", 400, "bad_parameter"),
            (base + "?activation=-1", 400, "bad_parameter"),
        ):
            status, body = await get_json(session, url)
            assert (status, body["error"]) == (code, needle), f"{url}: {status} {body}"
            assert body["message"], f"{url}: an error without a message"


async def test_build_info_in_the_operators_metrics(
    shared_ports: dict[str, int], shared_operator: RunningOperator
) -> None:
    async with aiohttp.ClientSession() as session:
        found = await samples(session, shared_ports["metrics"])
    info = {labels: v for (name, labels), v in found.items() if name == "bucketq_build_info"}
    expected = frozenset(
        {"version": __version__, "python": platform.python_version(), "format": str(FORMAT)}.items()
    )
    assert info == {expected: 1.0}


# -- figures come from the last refresh: a request never reads the bucket --------------------------------


async def test_endpoint_answers_from_the_last_refresh_without_the_bucket(
    tmp_path: Path, served_metrics: tuple[QueueMetrics, int]
) -> None:
    metrics, port = served_metrics
    path = tmp_path / "bucket"
    settings = Settings.from_dict({"backend": "file", "file_path": str(path)})
    async with Bucketq(settings) as bq:
        await bq.create_topic("jobs", partitions=1)
        for i in range(4):
            await bq.publish("jobs", {"n": i})
        await bq.init_subscription("jobs", "w")
        metrics.set_topic("team", "jobs", await topic_figures(bq, "jobs"), at=time.time() - 7)
    shutil.rmtree(path)  # the bucket is gone: any storage call would now fail or find nothing
    async with aiohttp.ClientSession() as session:
        status, body = await get_json(session, f"http://127.0.0.1:{port}/scaling/team/w")
        assert status == 200 and (body["pending"], body["replicas"]) == (4, 1)
        assert body["ageSeconds"] >= 7, "the answer says how old its figures are"
        found = await samples(session, port)
    assert found[("bucketq_subscription_pending", sub_labels("team", "jobs", "w"))] == 4
    metrics.forget_topic("team", "jobs")
    async with aiohttp.ClientSession() as session:
        status, body = await get_json(session, f"http://127.0.0.1:{port}/scaling/team/w")
    assert (status, body["error"]) == (404, "consumer_not_found")


# -- simulated scale-in: what KEDA would choose never drops below the lease holders ---------------------


@dataclass(frozen=True)
class Keda:
    """KEDA's decision for one ScaledObject with one metrics-api trigger (metricType AverageValue).

    Inactive (metric <= activation): scale to ``min_replicas`` (0 allowed) once the cooldown passed.
    Active: the HPA's desired count, ceil(metric / target), clamped to [max(min, 1), max]; with a
    ``tolerance`` it keeps the current count while the usage ratio is within it (the HPA's default
    is 0.1), from one replica when activating from zero.
    """

    target: float = 1.0
    activation: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 20
    tolerance: float = 0.0

    def desired(self, metric: float, current: int) -> int:
        if metric <= self.activation:
            return self.min_replicas
        current = max(current, 1)
        ratio = metric / (self.target * current)
        wanted = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(metric / self.target)
        return min(max(wanted, self.min_replicas, 1), self.max_replicas)


KEDAS = {"exact": Keda(), "hpa-tolerance": Keda(tolerance=0.1)}


async def quiescent(members: list[Consumer]) -> dict[str, int]:
    """Wait until no paused member's lease count moves (claims in progress have landed)."""
    last: dict[str, int] = {}
    stable = 0
    deadline = time.monotonic() + 20
    while stable < 4:
        assert time.monotonic() < deadline, "the members did not settle"
        now = {m.member: m.in_flight for m in members}
        stable = stable + 1 if now == last else 0
        last = now
        await asyncio.sleep(0.1)
    return last


@pytest.mark.slow
async def test_simulated_keda_never_scales_below_the_lease_holders(
    served_metrics: tuple[QueueMetrics, int],
) -> None:
    metrics, port = served_metrics
    backend = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    rng = random.Random(7)
    total = 40
    observer = await backend.connect()
    await observer.create_topic("jobs", partitions=3)
    for i in range(total):
        await observer.publish("jobs", {"n": i}, key=f"k{i}")
    # three members prefetching differently, each in its own connection (its own pod)
    members: list[Consumer] = []
    for prefetch in (1, 4, 10):
        bq = await backend.connect()
        members.append(
            await bq.register_consumer(
                "workers", "jobs", max_in_flight=prefetch, visibility_timeout_s=LEASE_S
            )
        )
    held: dict[str, list[Message]] = {m.member: [] for m in members}
    acked = 0
    current = {name: 0 for name in KEDAS}
    seen = {"holders-won": 0, "leased-no-backlog": 0, "zero": 0}
    url = f"http://127.0.0.1:{port}/scaling/default/workers?messagesPerReplica=25"

    async with aiohttp.ClientSession() as session:

        async def step(label: str) -> None:
            """Freeze the run, refresh the figures as the operator does, ask the endpoint, decide."""
            for m in members:
                m.pause()
            for _ in range(5):
                leases = await quiescent(members)
                metrics.set_topic("default", "jobs", await topic_figures(observer, "jobs"))
                # a claim still landing (a loaded machine) would make the comparison moot: again
                if {m.member: m.in_flight for m in members} == leases:
                    break
            status, body = await get_json(session, url)
            assert status == 200, body
            truth = sorted(name for name, count in leases.items() if count)
            assert body["leaseHolders"] == truth, f"{label}: holders {body['leaseHolders']} != {truth}"
            assert body["inFlight"] == sum(leases.values()), label
            assert body["pending"] == total - acked, label
            replicas = body["replicas"]
            assert replicas >= len(truth), f"{label}: {replicas} replicas for {len(truth)} holders"
            for name, keda in KEDAS.items():
                chosen = keda.desired(replicas, current[name])
                if name == "exact" or chosen < current[name]:
                    # a scale-in (or any decision of the exact model) keeps every holder
                    assert chosen >= len(truth), f"{label}, {name}: KEDA picks {chosen}, holders {truth}"
                if chosen == 0:
                    assert body["pending"] == 0 and not truth, f"{label}, {name}: zero while leased"
                current[name] = chosen
            seen["holders-won"] += len(truth) > math.ceil(body["pending"] / 25)
            seen["leased-no-backlog"] += bool(truth) and body["backlog"] == 0
            seen["zero"] += replicas == 0
            for m in members:
                m.resume()

        await step("start")
        # members take messages, ack some over time, and keep others leased
        for turn in range(30):
            if acked >= total - 6:
                break
            m = rng.choice(members)
            got = await m.poll(max_messages=rng.randint(1, 3), wait=0.3)
            held[m.member] += got
            keep = rng.randint(0, 2)
            for msg in held[m.member][keep:]:
                await msg.ack()
                acked += 1
            held[m.member] = held[m.member][:keep]
            await step(f"turn {turn}")
        # the tail: the members take all that still waits and ack all but one message each, until
        # nothing waits and every message left is leased; then they finish one member at a time,
        # so that the holders go down to none with nothing waiting
        deadline = time.monotonic() + 60
        while acked + sum(m.in_flight for m in members) < total:
            assert time.monotonic() < deadline, f"{acked} acked, the rest never got leased"
            for m in members:
                held[m.member] += await m.poll(max_messages=100, wait=0.1)
                for msg in held[m.member][1:]:
                    await msg.ack()
                    acked += 1
                held[m.member] = held[m.member][:1]
        await step("all leased")
        for m in members:
            for msg in await m.poll(max_messages=100, wait=0.2):
                held[m.member].append(msg)  # prefetched messages handed out at last
            for msg in held[m.member]:
                await msg.ack()
                acked += 1
            held[m.member] = []
            await step(f"{m.member} done")

    assert acked == total
    assert seen["holders-won"] > 0, "no step where the holders mattered: the run proves nothing"
    assert seen["leased-no-backlog"] > 0 and seen["zero"] == 1, seen
    assert current == {"exact": 0, "hpa-tolerance": 0}, "scaled to zero once everything was done"
    await backend.close_all()
