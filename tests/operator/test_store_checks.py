"""The operator runs the store checks (``bucketq doctor``) at start and reports them: the
``StoreChecked`` condition on every Topic, ``bucketq_store_check_passed`` in its metrics, a log
line per failed check. A healthy store (the file backend) and a broken one (a proxy in front of
moto that ignores If-Match), each under a real operator in the Kubernetes emulator.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from bucketq.config import Settings
from tests.operator.harness import (
    Kube,
    RunningOperator,
    condition,
    fast_settings,
    start_operator,
    wait_for,
)
from tests.operator.k8s_emulator import EmulatorThread
from tests.operator.test_consumers import metrics_text
from tests.operator.test_topics import topic
from tests.support.lying_s3 import LyingS3
from tests.support.servers import S3Server, free_ports


def _checked(kube: Kube, ns: str, status: str) -> dict[str, Any]:
    def found() -> dict[str, Any]:
        cond = condition(kube.get("topics", ns, "orders"), "StoreChecked")
        return cond if cond.get("status") == status else {}

    return wait_for(found, f"the Topic's StoreChecked condition to be {status}")


def _checking_operator(emulator: EmulatorThread, engine: Settings, ns: str, port: int) -> RunningOperator:
    settings = fast_settings([ns], store_checks=True, metrics_host="127.0.0.1", metrics_port=port)
    return start_operator(emulator.url, engine, settings)


def test_a_healthy_store_is_reported_checked(emulator: EmulatorThread, kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace("checked")
    engine = Settings.from_dict({"backend": "file", "file_path": str(tmp_path / "bucket")})
    (port,) = free_ports(1)
    running = _checking_operator(emulator, engine, ns, port)
    try:
        kube.create(topic(ns, "orders"))
        cond = _checked(kube, ns, "True")
        assert cond["reason"] == "ChecksPassed" and "strategy conditional_write" in cond["message"]
        text = metrics_text(port)
        for check in ("put_if_absent", "if_match", "read_after_write", "list_after_write", "clock"):
            assert f'bucketq_store_check_passed{{check="{check}"}} 1.0' in text, text
    finally:
        running.stop()


@pytest.mark.s3
def test_a_broken_store_is_reported_on_every_topic_in_metrics_and_logs(
    emulator: EmulatorThread, kube: Kube, moto_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    ns = kube.namespace("unchecked")
    (port,) = free_ports(1)
    caplog.set_level(logging.INFO, logger="bucketq.operator")
    with LyingS3(moto_server.endpoint_url, ignore_if_match=True) as proxy:
        engine = moto_server.settings(strategy="conditional_write", s3_endpoint_url=proxy.url)
        running = _checking_operator(emulator, engine, ns, port)
        try:
            kube.create(topic(ns, "orders"))
            cond = _checked(kube, ns, "False")
            assert cond["reason"] == "ChecksFailed"
            assert "if_match: a PUT with a stale If-Match ETag overwrote" in cond["message"]
            assert "put_if_absent" not in cond["message"]
            assert condition(kube.get("topics", ns, "orders"), "Ready")["status"] == "True", (
                "a failed check is reported, it does not stop reconciliation"
            )
            text = metrics_text(port)
            assert 'bucketq_store_check_passed{check="if_match"} 0.0' in text
            assert 'bucketq_store_check_passed{check="put_if_absent"} 1.0' in text
        finally:
            running.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("store check if_match FAILED") for m in warnings), warnings
    assert any("the store failed 1 check(s) (if_match)" in m for m in warnings), warnings
    secret = engine.s3_secret_access_key
    assert secret is not None and all(secret.get_secret_value() not in m for m in warnings)


@pytest.mark.s3
async def test_checks_that_cannot_run_say_so(moto_server: S3Server) -> None:
    """The store cannot be reached when the operator starts: the condition is Unknown with the
    reason, no check has a series, and no secret is in the message."""
    import asyncio

    from bucketq.operator.metrics import QueueMetrics
    from bucketq.operator.store_checks import StoreCheckRun

    with LyingS3(moto_server.endpoint_url) as proxy:
        url = proxy.url  # closed again: nothing listens there now
    engine = moto_server.settings(strategy="conditional_write", s3_endpoint_url=url)
    secret = engine.s3_secret_access_key.get_secret_value() if engine.s3_secret_access_key else ""
    run = StoreCheckRun(engine, lambda text: text.replace(secret, "***"))
    assert run.condition().reason == "Checking"
    metrics = QueueMetrics()
    run.start(metrics.set_store_checks)
    for _ in range(100):
        if run.error is not None:
            break
        await asyncio.sleep(0.1)
    await run.stop()
    cond = run.condition()
    assert (cond.ok, cond.reason) == (None, "ChecksNotRun"), cond
    assert secret not in cond.message
    assert b"bucketq_store_check_passed{" not in metrics.render()
