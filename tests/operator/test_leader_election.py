"""The Lease elector on its own (bucketq/operator/leader.py) against the emulated API server:
racing candidates, release, expiry measured on the candidate's clock, settings that cannot work."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from bucketq.operator.config import OperatorSettings
from bucketq.operator.leader import LeaderElector, LeaseApi, LeaseConfig
from tests.operator.harness import Kube, login_to
from tests.operator.k8s_emulator import EmulatorThread
from tests.support.tcp_proxy import TcpProxy


def elector(url: str, ns: str, who: str, **timing: float) -> LeaderElector:
    config = LeaseConfig(
        name="election",
        namespace=ns,
        identity=who,
        lease_duration_s=timing.get("lease", 2.0),
        renew_deadline_s=timing.get("renew", 1.2),
        retry_period_s=timing.get("retry", 0.2),
    )
    return LeaderElector(LeaseApi(login_to(url), ns, "election", timeout_s=1.0), config)


async def test_one_of_racing_candidates_leads_and_a_release_hands_over_at_once(
    emulator: EmulatorThread, kube: Kube
) -> None:
    ns = kube.namespace("elect")
    candidates = [elector(emulator.url, ns, f"c{i}") for i in range(4)]
    tasks = [asyncio.create_task(c.run()) for c in candidates]
    try:
        await asyncio.sleep(1.5)
        leaders = [c for c in candidates if c.leading.is_set()]
        assert len(leaders) == 1, [c.config.identity for c in leaders]
        first = leaders[0]
        assert kube.get("leases", ns, "election")["spec"]["holderIdentity"] == first.config.identity
        tasks[candidates.index(first)].cancel()
        released = asyncio.get_running_loop().time()
        await first.release()
        assert kube.get("leases", ns, "election")["spec"]["holderIdentity"] == ""
        while not any(c.leading.is_set() for c in candidates if c is not first):
            await asyncio.sleep(0.05)
        # far below the lease duration (2 s): a released Lease is not waited out
        assert asyncio.get_running_loop().time() - released < 1.0
        assert sum(c.leading.is_set() for c in candidates) == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in candidates:
            await c.api.close()


async def test_a_leader_cut_off_loses_after_the_renew_deadline_and_is_replaced_after_the_lease(
    emulator: EmulatorThread, kube: Kube
) -> None:
    ns = kube.namespace("elect")
    with TcpProxy.to(emulator.url) as proxy:
        leader = elector(proxy.url, ns, "leader")
        standby = elector(emulator.url, ns, "standby")
        lead_task = asyncio.create_task(leader.run())
        while not leader.leading.is_set():
            await asyncio.sleep(0.05)
        standby_task = asyncio.create_task(standby.run())
        await asyncio.sleep(0.5)
        assert not standby.leading.is_set()
        loop = asyncio.get_running_loop()
        proxy.down()
        cut = loop.time()
        await asyncio.wait_for(lead_task, 5)  # run() returns once leadership is lost
        lost_after = loop.time() - cut
        assert leader.lost.is_set() and not leader.leading.is_set()
        assert lost_after <= leader.config.renew_deadline_s + 0.3
        while not standby.leading.is_set():
            await asyncio.sleep(0.05)
        taken_after = loop.time() - cut
        # the leader had stopped before the standby could lead: the fence is between the two
        assert lost_after < taken_after
        assert taken_after >= leader.config.lease_duration_s - leader.config.retry_period_s
        standby_task.cancel()
        await asyncio.gather(standby_task, return_exceptions=True)
        await leader.api.close()
        await standby.api.close()


async def test_an_unreachable_api_never_leads(kube: Kube) -> None:
    with TcpProxy.to("http://127.0.0.1:9") as proxy:
        proxy.down()
        candidate = elector(proxy.url, "default", "lonely")
        task = asyncio.create_task(candidate.run())
        await asyncio.sleep(1.0)
        assert not candidate.leading.is_set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await candidate.api.close()


def test_timing_and_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseConfig(name="l", namespace="n", identity="i", lease_duration_s=5, renew_deadline_s=5)
    with pytest.raises(ValidationError, match="needs webhook=false"):
        OperatorSettings(leader_election=True, webhook=True)
    with pytest.raises(ValidationError, match="leader_renew_deadline_s"):
        OperatorSettings(leader_election=True, webhook=False, leader_renew_deadline_s=20)
    OperatorSettings(leader_election=True, webhook=False)
