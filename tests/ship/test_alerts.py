"""The chart's PrometheusRule and dashboard, with the real helm and promtool binaries.

The rules are rendered by helm, checked by ``promtool check rules`` and unit-tested by ``promtool
test rules`` with the files in ``tests/ship/alerts/`` (each alert fires on a bad series and stays
quiet on good ones). Every metric the dashboard, the alerts and the KEDA queries name must be one a
real operator metrics render or the sidecar's metrics module exports: a typo cannot pass.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.ship.chart_tools import REPO, Doc, find, one, render, template
from tests.support import tools

ALERT_TESTS = REPO / "tests" / "ship" / "alerts"
OPERATIONS = REPO / "docs" / "operations.md"
RULE_APIS = ["monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PrometheusRule"]
ALERTS = {
    "BucketqSubscriptionLagGrowing",
    "BucketqOldestMessageTooOld",
    "BucketqDeadLettersGrowing",
    "BucketqStorageUnreachable",
    "BucketqSidecarNotReady",
}
KEDA_APIS = ["keda.sh/v1alpha1", "keda.sh/v1alpha1/ScaledObject"]
FULLNAME = "bq-bucketq"


def rule_groups(values: dict[str, Any] | None = None) -> list[Doc]:
    return list(one(render(values, api_versions=RULE_APIS), "PrometheusRule")["spec"]["groups"])


def alerts(groups: list[Doc]) -> dict[str, Doc]:
    return {r["alert"]: r for g in groups for r in g["rules"]}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tools.promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


@pytest.fixture(scope="module")
def groups() -> list[Doc]:
    return rule_groups()


# -- the object -------------------------------------------------------------------------------------------


@pytest.mark.e2e  # helm / promtool processes
def test_prometheus_rule_only_where_the_api_exists_and_when_enabled() -> None:
    assert not find(render(), "PrometheusRule"), "rendered without monitoring.coreos.com"
    rule = one(render(api_versions=RULE_APIS), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "bucketq-system"
    assert not find(
        render({"metrics": {"prometheusRule": {"enabled": False}}}, api_versions=RULE_APIS), "PrometheusRule"
    )


@pytest.mark.e2e  # helm / promtool processes
def test_every_alert_has_severity_summary_description_and_runbook(groups: list[Doc]) -> None:
    found = alerts(groups)
    assert set(found) == ALERTS
    for name, rule in found.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        for key in ("summary", "description", "runbook_url"):
            assert rule["annotations"].get(key), f"{name} has no {key}"
    assert found["BucketqStorageUnreachable"]["labels"]["severity"] == "critical"
    assert found["BucketqStorageUnreachable"]["for"] == "5m"
    assert found["BucketqSidecarNotReady"]["for"] == "5m"
    assert found["BucketqSubscriptionLagGrowing"]["for"] == "15m"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.e2e  # helm / promtool processes
def test_runbooks_are_sections_of_the_operations_guide(groups: list[Doc]) -> None:
    anchors = {
        _slug(line.lstrip("#")) for line in OPERATIONS.read_text().splitlines() if line.startswith("#")
    }
    base = yaml.safe_load((REPO / "helm" / "bucketq" / "values.yaml").read_text())["metrics"][
        "prometheusRule"
    ]["runbookUrl"]
    assert base.endswith("/docs/operations.md")
    for name, rule in alerts(groups).items():
        url, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert url == base, name
        assert anchor in anchors, f"{name}: docs/operations.md has no section #{anchor}"


@pytest.mark.e2e  # helm / promtool processes
def test_rule_values_reach_the_rules() -> None:
    values = {
        "metrics": {
            "prometheusRule": {
                "labels": {"release": "kube-prometheus"},
                "alertLabels": {"team": "queues"},
                "runbookUrl": "https://wiki.example.com/bucketq/operations.md",
                "oldestMessageAgeSeconds": 600,
                "lagGrowingMinPending": 5000,
                "disabledAlerts": ["BucketqSidecarNotReady", "BucketqStorageUnreachable"],
            }
        }
    }
    rule = one(render(values, api_versions=RULE_APIS), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == ["bucketq.queues"], "a group with every alert disabled is left out"
    found = alerts(groups)
    assert set(found) == ALERTS - {"BucketqSidecarNotReady", "BucketqStorageUnreachable"}
    assert "> 600" in found["BucketqOldestMessageTooOld"]["expr"]
    assert "600 seconds" in found["BucketqOldestMessageTooOld"]["annotations"]["description"]
    assert "> 5000" in found["BucketqSubscriptionLagGrowing"]["expr"]
    for name, r in found.items():
        assert r["labels"] == {"severity": "warning", "team": "queues"}, name
        assert r["annotations"]["runbook_url"].startswith("https://wiki.example.com/bucketq/operations.md#")
    every = {"metrics": {"prometheusRule": {"disabledAlerts": sorted(ALERTS)}}}
    assert not find(render(every, api_versions=RULE_APIS), "PrometheusRule"), "an empty rule is left out"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"prometheusRule": {"disabledAlerts": ["BucketqNoSuchAlert"]}}, "disabledAlerts"),
        ({"prometheusRule": {"alertLabels": {"severity": "page"}}}, "alertLabels"),
        ({"prometheusRule": {"alertLabels": {"bad-name": "x"}}}, "alertLabels"),
        ({"prometheusRule": {"oldestMessageAgeSeconds": 0}}, "oldestMessageAgeSeconds"),
        ({"prometheusRule": {"runbookUrl": "docs/operations.md"}}, "runbookUrl"),
        ({"prometheusRule": {"lagGrowing": True}}, "lagGrowing"),
    ],
)
@pytest.mark.e2e  # helm / promtool processes
def test_rule_values_are_checked(values: dict[str, Any], complaint: str) -> None:
    result = template({"metrics": values}, check=False)
    assert result.returncode != 0, f"the chart accepted {values}"
    assert complaint in result.stderr, result.stderr


# -- promtool ---------------------------------------------------------------------------------------------


@pytest.mark.e2e  # helm / promtool processes
def test_promtool_accepts_the_rules(groups: list[Doc], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


@pytest.mark.e2e  # helm / promtool processes
@pytest.mark.parametrize("case", sorted(p.name for p in ALERT_TESTS.glob("*.yaml")))
def test_alert_unit_tests(case: str, groups: list[Doc], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(ALERT_TESTS / case, tmp_path / case)
    result = promtool("test", "rules", case, cwd=tmp_path)
    assert result.returncode == 0, f"promtool test rules {case}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in ALERT_TESTS.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["rules.yaml"], path.name
        for test in doc["tests"]:
            for check in test["alert_rule_test"]:
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == ALERTS, f"alerts never shown firing: {ALERTS - firing}"
    assert quiet == ALERTS, f"alerts never shown quiet: {ALERTS - quiet}"


# -- every metric named anywhere is exported --------------------------------------------------------------


_SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}


def _names(text: str) -> tuple[set[str], set[str]]:
    """(sample names in an exposition text, families without any sample)."""
    names: set[str] = set()
    empty: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples if not s.name.endswith("_created")}
        names |= {family.name + s for s in _SUFFIXES.get(family.type, [""])}
        if not family.samples:
            empty.add(family.name)
    return names, empty


async def _operator_render() -> str:
    """The operator's /metrics with figures of a real engine run (every family has samples)."""
    from bucketq.config import Settings
    from bucketq.core.app import Bucketq
    from bucketq.core.gc import TopicStorage
    from bucketq.operator.metrics import QueueMetrics
    from bucketq.operator.topics import topic_figures
    from bucketq.storage.checks import check_store

    metrics = QueueMetrics()
    async with Bucketq(Settings.from_dict({"backend": "memory", "strategy": "conditional_write"})) as bq:
        await bq.create_topic("orders", partitions=2)
        for i in range(5):
            await bq.publish("orders", {"n": i})
        member = await bq.register_consumer("billing", "orders", max_in_flight=2, visibility_timeout_s=60)
        for _ in range(100):
            if await member.poll(max_messages=1, wait=0.1):
                break
        metrics.set_topic("shop", "orders", await topic_figures(bq, "orders"))
        await member.close()
        metrics.set_store_checks(await check_store(bq.storage, "doctor", rounds=1, writers=2))
    metrics.set_storage("shop", "orders", TopicStorage(bytes=10, segments=1, held_for_lagging=0))
    metrics.storage_reachable.labels("shop").set(1)
    metrics.reconciles.labels("Topic", "ok").inc()
    metrics.reconcile_errors.labels("Topic", "StorageUnavailable").inc()
    metrics.gc_deleted.labels("shop", "orders", "segments").inc()
    return metrics.render().decode()


def exported_names() -> set[str]:
    from bucketq.sidecar.metrics import Metrics

    operator, empty = _names(asyncio.run(_operator_render()))
    assert not empty, f"the operator render left families without samples: {empty}"
    assert "bucketq_subscription_pending" in operator and "bucketq_consumer_lease_holders" in operator
    sidecar = Metrics()
    sidecar.prepare("billing", ["orders"], push=True)
    from_sidecar, _ = _names(generate_latest(sidecar.registry).decode())
    return operator | from_sidecar


def referenced_queries() -> dict[str, str]:
    """Where -> PromQL, for the dashboard (panels and variables), the alerts and the KEDA queries."""
    out: dict[str, str] = {}
    dashboard = json.loads((REPO / "helm" / "bucketq" / "files" / "dashboard-queues.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            out[f"dashboard panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            out[f"dashboard variable {variable['name']}"] = variable["definition"]
    for name, rule in alerts(rule_groups()).items():
        out[f"alert {name}"] = rule["expr"]
    keda = {
        "keda": {
            "trigger": "prometheus",
            "scaledObjects": [{"name": "w", "consumer": "billing", "scaleTargetRef": {"name": "w"}}],
        }
    }
    examples = [d for p in (REPO / "examples").glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d]
    for path in sorted((REPO / "examples").glob("*.yaml")):
        # the alternative the example shows in comments counts too
        for i, query in enumerate(re.findall(r"^#\s+query:\s*(.+)$", path.read_text(), re.MULTILINE)):
            out[f"examples/{path.name} commented query {i}"] = query
    for so in find(render(keda, api_versions=KEDA_APIS), "ScaledObject") + find(examples, "ScaledObject"):
        for i, trigger in enumerate(so["spec"]["triggers"]):
            if trigger["type"] == "prometheus":
                out[f"ScaledObject {so['metadata']['name']} trigger {i}"] = trigger["metadata"]["query"]
    return out


@pytest.mark.e2e  # helm / promtool processes
def test_every_metric_named_by_dashboard_alerts_and_keda_is_exported(tmp_path: Path) -> None:
    known = exported_names()
    queries = referenced_queries()
    assert sum(k.startswith("ScaledObject") for k in queries) >= 2
    assert sum("commented query" in k for k in queries) >= 2
    named: set[str] = set()
    for where, expr in queries.items():
        for name in re.findall(r"\bbucketq_[a-z_]+\b", expr):
            named.add(name)
            assert name in known, f"{where}: {name} is exported by neither the operator nor the sidecar"
    for wanted in (
        "bucketq_subscription_pending",
        "bucketq_consumer_lease_holders",
        "bucketq_build_info",
        "bucketq_sidecar_ready",
        "bucketq_storage_reachable",
    ):
        assert wanted in named, f"nothing shows {wanted}"
    # and every query parses (as promtool reads them)
    rules = [
        {"record": f"bucketq:check{i}", "expr": q.replace("$namespace", ".*")}
        for i, q in enumerate(queries.values())
        if not q.startswith("label_values(")
    ]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    result = promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert result.returncode == 0, f"promtool rejects a query:\n{result.stdout}{result.stderr}"


def test_example_scaled_object_asks_the_scaling_endpoint() -> None:
    """examples/keda-scaledobject.yaml: its URL is the operator's route, and what it reads is there."""
    import urllib.parse

    from bucketq.core.models import TopicConfig
    from bucketq.core.stats import SubscriptionStats
    from bucketq.core.topics import TopicInfo
    from bucketq.operator.metrics import QueueMetrics
    from bucketq.operator.scaling import scaling_figures
    from bucketq.operator.topics import TopicFigures

    (so,) = [d for d in yaml.safe_load_all((REPO / "examples" / "keda-scaledobject.yaml").read_text()) if d]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert (meta["targetValue"], meta["activationTargetValue"]) == ("1", "0")
    url = urllib.parse.urlsplit(meta["url"])
    match = re.fullmatch(r"/scaling/([^/]+)/([^/]+)", url.path)
    assert match, url.path
    namespace, consumer = match.groups()
    example_consumer = yaml.safe_load((REPO / "examples" / "consumer.yaml").read_text())
    assert consumer == example_consumer["metadata"]["name"]
    assert url.hostname == f"{FULLNAME}-metrics.bucketq-system.svc" and url.port == 9090
    sub = SubscriptionStats(
        topic="orders",
        consumer=consumer,
        messages=10,
        backlog=9,
        in_flight=1,
        delayed=0,
        acked=0,
        dead_lettered=0,
        redelivered=0,
        oldest_age_s=None,
        partitions=[],
        holders=["m1"],
    )
    metrics = QueueMetrics()
    info = TopicInfo(name="orders", config=TopicConfig(), created_at=0.0, consumers=[consumer])
    metrics.set_topic(namespace, "orders", TopicFigures(info, [sub]))
    query = dict(urllib.parse.parse_qsl(url.query))
    answer = scaling_figures(metrics, namespace, consumer, query).to_json()
    assert answer[meta["valueLocation"]] == 1


def test_dashboard_shows_scaling_health_alerts_and_versions() -> None:
    dashboard = json.loads((REPO / "helm" / "bucketq" / "files" / "dashboard-queues.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", ()))
    for wanted in (
        "bucketq_subscription_pending",
        "bucketq_consumer_lease_holders",
        "bucketq_build_info",
        "bucketq_sidecar_ready",
        "bucketq_storage_reachable",
        'ALERTS{alertname=~"Bucketq.*"',
    ):
        assert wanted in exprs, f"the dashboard has no panel on {wanted}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells = [
        (x, y)
        for p in dashboard["panels"]
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
