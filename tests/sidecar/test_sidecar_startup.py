"""A sidecar starting outside a pod: where it listens, and what it asks the bucket while it waits."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketq.config import Settings
from tests.sidecar.sidecar_procs import (
    SidecarFactory,
    SidecarProc,
    create_topics,
    eventually,
    wait_ready_or_fail,
)

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


def listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses with a socket listening on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, _, state = line.split()[1:4]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def requests(sc: SidecarProc) -> dict[tuple[str, str], float]:
    """S3 requests so far, by (operation, kind of object)."""
    with urllib.request.urlopen(sc.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "bucketq_s3_requests_total":
                key = (s.labels["op"], s.labels["kind"])
                out[key] = out.get(key, 0) + s.value
    return out


def retries_logged(sc: SidecarProc) -> int:
    return sc.log(10_000).count("not ready: ")


async def test_probe_runs_once_while_a_topic_is_missing(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    """The bucket probe (a PUT and a DELETE under _probe/) and the producer's registration run once per
    process: while the consumer's topic is missing only the topic lookup is retried."""
    sc = sidecars(
        moto_settings, "waiting", consumer="c", topics="later", connect_retry_max_s=0.2, wait_ready=False
    )
    eventually(lambda: retries_logged(sc) >= 3 or None, 20, "three retries while the topic is missing")
    first = requests(sc)
    probes = {k: v for k, v in first.items() if k[1] == "probe"}
    assert probes, f"no probe requests counted: {first}"
    eventually(lambda: retries_logged(sc) >= 8 or None, 20, "five more retries")
    later = requests(sc)
    for key in [k for k in later if k[1] in ("probe", "member", "format")]:
        assert later[key] == first.get(key), f"{key} repeated while waiting: {first.get(key)} -> {later[key]}"
    assert later[("GET", "topic")] > first[("GET", "topic")], "the missing topic was not looked for again"

    await create_topics(moto_settings, "later")
    wait_ready_or_fail(sc)
    with sc.client() as client:
        client.publish("later", {"n": 1})
        assert client.pull(max_messages=1, wait=5)
    ready = requests(sc)
    assert {k: v for k, v in ready.items() if k[1] == "probe"} == probes


async def test_metrics_and_probes_listen_on_loopback_outside_a_pod(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "local")
    sc = sidecars(moto_settings, "local")
    assert "KUBERNETES_SERVICE_HOST" not in sc.env and "BUCKETQ_SIDECAR_METRICS_HOST" not in sc.env
    assert listening_addresses(sc.metrics_port) == {"127.0.0.1"}
    assert listening_addresses(sc.port) == {"127.0.0.1"}
    with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/readyz", timeout=5) as resp:
        assert resp.status == 200
    # in a pod (the kubelet sets KUBERNETES_SERVICE_HOST) the kubelet and Prometheus reach them
    pod = sidecars(moto_settings, "pod", extra_env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert listening_addresses(pod.metrics_port) == {"0.0.0.0"}
    assert listening_addresses(pod.port) == {"127.0.0.1"}
