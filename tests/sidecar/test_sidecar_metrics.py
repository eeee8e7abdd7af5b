"""``/metrics`` is valid Prometheus exposition (prometheus_client's parser and ``promtool``)."""

from __future__ import annotations

import platform
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketq import __version__
from bucketq.client import message
from bucketq.config import Settings
from bucketq.core.app import FORMAT
from bucketq.core.keys import _KINDS
from tests.sidecar.sidecar_procs import SidecarFactory, create_topics, eventually
from tests.support import tools

pytestmark = [pytest.mark.s3, pytest.mark.e2e]
KEY_KINDS = [kind for _, kind in _KINDS]

EXPECTED = {
    "bucketq_messages_published",
    "bucketq_messages_delivered",
    "bucketq_messages_acked",
    "bucketq_messages_nacked",
    "bucketq_messages_dead_lettered",
    "bucketq_messages_redelivered",
    "bucketq_lease_lost",
    "bucketq_commit_batch_size",
    "bucketq_commit_duration_seconds",
    "bucketq_commit_conflicts",
    "bucketq_commit_rebases",
    "bucketq_s3_requests",
    "bucketq_s3_request_duration_seconds",
    "bucketq_leases_held",
    "bucketq_publish_buffer_depth",
    "bucketq_push_duration_seconds",
    "bucketq_push_deliveries",
    "bucketq_sidecar_ready",
    "bucketq_build_info",
}


async def test_metrics_parse_and_pass_promtool(moto_settings: Settings, sidecars: SidecarFactory) -> None:
    await create_topics(moto_settings, "metered", partitions=2)
    sc = sidecars(moto_settings, "metered", consumer="m", topics="metered", delivery="push", app_port=9)
    with sc.client() as client:  # nothing listens on port 9: push waits for the app, pull is refused
        client.publish_batch("metered", [message({"n": i}) for i in range(20)])

    def scrape() -> str:
        with urllib.request.urlopen(sc.metrics_url, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            body: bytes = resp.read()
            return body.decode()

    def committed() -> str | None:
        text = scrape()
        return text if "bucketq_commit_batch_size_count" in text else None

    text = eventually(committed, 20, "a group commit to show in /metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= EXPECTED, f"missing: {sorted(EXPECTED - set(families))}"

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert samples[("bucketq_messages_published_total", (("topic", "metered"),))] == 20
    assert samples[("bucketq_sidecar_ready", ())] == 1
    assert samples[("bucketq_publish_buffer_depth", ())] == 0
    build = (("format", str(FORMAT)), ("python", platform.python_version()), ("version", __version__))
    assert samples[("bucketq_build_info", build)] == 1
    assert len(families["bucketq_build_info"].samples) == 1  # one series: this process's build
    assert sum(v for (name, _), v in samples.items() if name == "bucketq_s3_requests_total") > 0
    # requests by kind of object (the dashboard's requests per message by kind): the publishes wrote
    # segments; every kind is one of the key layout's, never a key itself
    requests = {
        dict(labels)["kind"] for (name, labels), _ in samples.items() if name == "bucketq_s3_requests_total"
    }
    assert (
        samples[("bucketq_s3_requests_total", (("kind", "segment"), ("op", "PUT"), ("status", "200")))] >= 1
    )
    assert requests <= set(KEY_KINDS) | {"bucket", "other"}, requests
    assert families["bucketq_s3_request_duration_seconds"].type == "histogram"

    with urllib.request.urlopen(sc.url + "/metrics", timeout=5) as resp:  # also on the API port
        assert b"bucketq_messages_published_total" in resp.read()

    promtool = tools.promtool()
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
