"""The dashboard's cost row, evaluated by a real Prometheus server over real sidecar metrics.

Three stand-in sidecars expose the sidecar's own metrics registry (:class:`bucketq.sidecar.metrics.
Metrics`, so names and labels are the real ones); each scrape first advances its counters by a fixed
step, so that between any two scrapes a target's requests per message are exactly known. Two targets
in namespace ``shop`` share one step shape at different sizes (so the sum over pods is exact whatever
the scrape phases), a third in ``billing`` has another shape (so a query that ignores ``$namespace``
gives a wrong answer). The expected prices come from :mod:`bucketq.bench.pricing`, the figures
``bucketq bench`` bills: a price typed wrong in the dashboard, a missing operation or a wrong tier
fails here.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bucketq.bench.pricing import (
    MINUTES_PER_MONTH,
    S3_OTHER_USD_PER_1000,
    S3_USD_PER_1000,
    SQS_USD_PER_MILLION_MESSAGES,
    usd,
)
from bucketq.sidecar.metrics import Metrics
from tests.e2e.e2e_helpers import Processes, Target, prometheus
from tests.operator.harness import wait_for
from tests.ship.chart_tools import REPO

pytestmark = pytest.mark.e2e

DASHBOARD = REPO / "helm" / "bucketq" / "files" / "dashboard-queues.json"
Step = dict[tuple[str, str, str], int]  # (op, kind, status) -> requests per scrape

# per scrape: 10 messages published and these requests (shop's shape; the second pod doubles it)
SHOP_STEP: Step = {
    ("PUT", "segment", "200"): 2,
    ("PUT", "delta", "412"): 1,
    ("PUT", "head", "200"): 1,
    ("GET", "segment", "200"): 5,
    ("GET", "segment", "404"): 1,
    ("LIST", "delta", "200"): 1,
    ("HEAD", "topic", "200"): 2,
    ("DELETE", "segment", "200"): 3,
}
SHOP_PUBLISHED = 10
BILLING_STEP: Step = {("PUT", "segment", "200"): 7, ("GET", "delta", "200"): 1}
BILLING_PUBLISHED = 1


class SteppedSidecar:
    """A sidecar's metrics registry whose counters advance by ``step`` at every scrape."""

    def __init__(self, step: Step, published: int) -> None:
        self.metrics = Metrics()
        self.step, self.published = step, published
        self.lock = threading.Lock()
        self.scrapes = 0
        # every series exists from the first scrape on, so all share the same samples
        for op, kind, status in step:
            self.metrics.s3_requests.labels(op, status, kind)
        self.metrics.published.labels("orders")

    def scrape(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            for (op, kind, status), n in self.step.items():
                self.metrics.s3_requests.labels(op, status, kind).inc(n)
            self.metrics.published.labels("orders").inc(self.published)
            return self.metrics.render()


@contextlib.contextmanager
def serving(sidecar: SteppedSidecar) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = sidecar.scrape() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def cost_panels() -> dict[str, dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"].startswith("Cost")]
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    return {p["title"]: p for p in below}


def per_message(step: Step, published: int) -> dict[tuple[str, str], float]:
    out: Counter[tuple[str, str]] = Counter()
    for (op, kind, _), n in step.items():
        out[(op, kind)] += n
    return {key: n / published for key, n in out.items()}


def by_op(step: Step, published: int) -> dict[str, float]:
    out: Counter[str] = Counter()
    for (op, _, _), n in step.items():
        out[op] += n
    return {op: n / published for op, n in out.items()}


def query(url: str, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
    params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", f"PromQL {expr!r} failed: {body}"
    return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
def test_cost_row_on_a_real_prometheus(tmp_path: Path) -> None:
    panels = cost_panels()
    assert len(panels) == 3, sorted(panels)
    by_kind = next(p for t, p in panels.items() if "requests per published message" in t)
    per_million = next(p for t, p in panels.items() if "USD per million messages" in t)
    monthly = next(p for t, p in panels.items() if "per 30-day month" in t)

    shop_a, shop_b = (
        SteppedSidecar(SHOP_STEP, SHOP_PUBLISHED),
        SteppedSidecar({k: 2 * n for k, n in SHOP_STEP.items()}, 2 * SHOP_PUBLISHED),
    )
    billing = SteppedSidecar(BILLING_STEP, BILLING_PUBLISHED)
    processes = Processes(tmp_path)
    with contextlib.ExitStack() as stack:
        stack.callback(processes.stop_all)
        targets = [
            Target("sidecars", stack.enter_context(serving(s)), {"namespace": ns, "pod": pod})
            for s, ns, pod in ((shop_a, "shop", "a"), (shop_b, "shop", "b"), (billing, "billing", "c"))
        ]
        prom = stack.enter_context(prometheus(processes, targets))
        wait_for(
            lambda: (prom.value("min(count_over_time(bucketq_messages_published_total[5m]))") or 0) >= 4,
            "four scrapes of every target",
            timeout=30,
            interval=0.5,
        )
        at = time.time()

        def evaluate(panel: dict[str, Any], ref: str, namespace: str) -> list[tuple[dict[str, str], float]]:
            (target,) = [t for t in panel["targets"] if t["refId"] == ref]
            return query(prom.url, target["expr"].replace("$namespace", namespace), at)

        # requests per message by operation and kind: shop's shape, whatever the two pods' phases
        got = {(m["op"], m["kind"]): v for m, v in evaluate(by_kind, "A", "shop")}
        wanted = per_message(SHOP_STEP, SHOP_PUBLISHED)
        assert got.keys() == wanted.keys(), got
        for key, value in wanted.items():
            assert close(got[key], value), f"{key}: {got[key]} requests per message, wanted {value}"
        got = {(m["op"], m["kind"]): v for m, v in evaluate(by_kind, "A", "billing")}
        assert got == pytest.approx(per_message(BILLING_STEP, BILLING_PUBLISHED), rel=1e-9)

        # USD per million messages at list prices, and SQS's line beside it
        for namespace, step, published in (
            ("shop", SHOP_STEP, SHOP_PUBLISHED),
            ("billing", BILLING_STEP, BILLING_PUBLISHED),
        ):
            ((_, price),) = evaluate(per_million, "A", namespace)
            wanted_price = usd(by_op(step, published)) * 1_000_000
            assert close(price, wanted_price), f"{namespace}: ${price} per million, wanted ${wanted_price}"
        ((_, sqs),) = evaluate(per_million, "B", "shop")
        assert close(sqs, SQS_USD_PER_MILLION_MESSAGES)

        # a month at the current rate, per namespace: price per message x messages per second x month
        months = {m["namespace"]: v for m, v in evaluate(monthly, "A", ".*")}
        assert set(months) == {"shop", "billing"}
        for namespace, step, published in (
            ("shop", SHOP_STEP, SHOP_PUBLISHED),
            ("billing", BILLING_STEP, BILLING_PUBLISHED),
        ):
            ((_, rate),) = query(
                prom.url, f'sum(rate(bucketq_messages_published_total{{namespace="{namespace}"}}[5m]))', at
            )
            wanted_month = usd(by_op(step, published)) * rate * MINUTES_PER_MONTH * 60
            assert close(months[namespace], wanted_month), (
                f"{namespace}: {months[namespace]} vs {wanted_month}"
            )


def test_cost_queries_price_every_operation_in_its_tier() -> None:
    """The price tiers written in the queries are those of bucketq.bench.pricing, for every operation
    the sidecar counts (an operation in no tier would be billed nothing)."""
    import re

    from bucketq.sidecar import instrumented

    ops = set(re.findall(r'self\._call\(\s*"([A-Z]+)"', Path(instrumented.__file__).read_text())) | {"LIST"}
    assert ops == {"GET", "HEAD", "PUT", "DELETE", "LIST"}
    exprs = [t["expr"] for p in cost_panels().values() for t in p["targets"]]
    tiers: dict[float, set[str]] = {}
    for expr in exprs:
        for sign, names, price in re.findall(r'op(=~|!~)"([A-Z|]+)"\}\[5m\]\) \* ([0-9.]+)', expr):
            listed = set(names.split("|"))
            billed = {op for op in ops | set(S3_USD_PER_1000) if (op in listed) == (sign == "=~")}
            tiers.setdefault(float(price), set()).update(billed)
    assert len(tiers) == 2, tiers
    for price, billed in tiers.items():
        for op in billed:
            assert S3_USD_PER_1000.get(op, S3_OTHER_USD_PER_1000) * 1000 == price, (
                f"{op} billed at {price} per million"
            )
    unbilled = (ops | set(S3_USD_PER_1000)) - set().union(*tiers.values())
    assert {op for op in unbilled if S3_USD_PER_1000.get(op, S3_OTHER_USD_PER_1000)} == set(), unbilled
