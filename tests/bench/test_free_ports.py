"""Ports for the servers tests and ``bucketq dev`` start: free, distinct, and never ones the kernel
could hand to an outgoing connection meanwhile (bucketq/bench/servers.py:free_ports)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bucketq.bench import servers
from bucketq.bench.servers import free_ports


def _ephemeral() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux only")
def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low, _ = _ephemeral()
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(10000 <= p < low for p in ports), ports
    with socket.socket() as s:  # each can be bound, right away
        s.bind(("127.0.0.1", ports[0]))


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        # only two candidates: the one in use and one other
        monkeypatch.setattr(servers, "_LOWEST_CHOSEN_PORT", taken)
        monkeypatch.setattr(servers, "_ephemeral_range_start", lambda: taken + 2)
        if not servers.port_is_free(taken + 1):
            pytest.skip("the neighbouring port is in use too")
        assert free_ports(1) == [taken + 1]


def test_without_a_known_ephemeral_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "_ephemeral_range_start", lambda: None)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
