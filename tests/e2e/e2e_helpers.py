"""What both end-to-end tests share: kubectl, a real Prometheus, processes, the examples, the scenario.

The scenario is the same on a kind cluster and on the local "cluster" (the API emulator plus local
processes): apply the example Topic, Consumer and DeadLetterPolicy, publish orders through a worker
pod's sidecar (one of them malformed), see every good order processed by the example push worker,
the malformed one in the dead-letter topic, and Prometheus answering PromQL on the queue metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bucketq import Bucketq
from bucketq.client import Client, message
from bucketq.config import Settings
from tests.operator.harness import wait_for
from tests.support import tools
from tests.support.servers import _clean_env as servers_clean_env
from tests.support.servers import free_ports

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
NAMESPACE = "shop"  # where the example workloads go
TOPIC, CONSUMER, DLQ = "orders", "billing", "orders.dlq"
CUSTOM_RESOURCES = ("deadletterpolicy.yaml", "topic.yaml", "consumer.yaml")  # in dependency order
WORKER = "worker-deployment.yaml"
SIDECAR = "bucketq-sidecar"


def example(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(doc, dict), f"examples/{name} is not one YAML object"
    return doc


def worker_command(container: Mapping[str, Any], python: str, examples_dir: str) -> list[str]:
    """The example worker image's command: the push worker on the container's port.

    The example Deployment names an application image (``ghcr.io/example/billing-worker``); both
    end-to-end tests run examples/push_worker.py in its place, with the same port.
    """
    ports = [p["containerPort"] for p in container.get("ports") or ()]
    assert ports, f"the example worker container {container['name']} declares no port"
    return [python, f"{examples_dir}/push_worker.py", "--port", str(ports[0])]


# -- kubectl -----------------------------------------------------------------------------------------


@dataclass
class Kubectl:
    binary: str
    kubeconfig: Path

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        result = subprocess.run(
            [self.binary, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        data = json.loads(self("get", kind, name, "-n", namespace, "-o", "json"))
        assert isinstance(data, dict)
        return data

    def wait_phase(
        self, kind: str, name: str, namespace: str, phase: str = "Ready", timeout: float = 60
    ) -> None:
        def reached() -> bool:
            status = self.get(kind, name, namespace).get("status") or {}
            assert status.get("phase") != "Failed", f"{kind} {name} failed: {status}"
            return bool(status.get("phase") == phase)

        wait_for(reached, f"{kind} {namespace}/{name} to be {phase}", timeout=timeout, interval=0.3)

    def secret(self, name: str, namespace: str) -> dict[str, str]:
        import base64

        data = self.get("secret", name, namespace).get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}


def kubeconfig(path: Path, server: str, namespace: str = "default") -> Path:
    """A kubeconfig for an API server at ``server`` (no credentials)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server}}],
        "users": [{"name": "e2e", "user": {}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e", "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


# -- processes -----------------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without bucketq, AWS or kubectl settings (a container starts from nothing)."""
    env = servers_clean_env()
    env.pop("KUBECONFIG", None)
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), NO_COLOR="1")
    env.update(extra)
    return env


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"{self.name} exited with {code}:\n{self.log()}"

    def stop(self, grace: float = 10) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


@dataclass
class Processes:
    """Processes started by a test, all stopped at the end (most recent first)."""

    workdir: Path
    started: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> Proc:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd or self.workdir,
            )
        proc = Proc(name, process, log_path)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.process.poll()}):\n{p.log(40)}" for p in self.started)


def http_ok(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError):
        return False


# -- Prometheus ------------------------------------------------------------------------------------------


@dataclass
class Target:
    job: str
    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)
    honor_labels: bool = False


@dataclass
class Prometheus:
    """A real Prometheus server on 127.0.0.1, scraping ``targets`` every second."""

    url: str
    proc: Proc

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        query = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", f"PromQL {expr!r} failed: {body}"
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def value(self, expr: str) -> float | None:
        """The single value of ``expr`` (None when it has no sample)."""
        result = self.query(expr)
        assert len(result) <= 1, f"PromQL {expr!r} gave several series: {result}"
        return result[0][1] if result else None

    def wait_value(self, expr: str, wanted: float, timeout: float = 60) -> None:
        seen: list[float | None] = []

        def check() -> bool:
            self.proc.alive()
            seen.append(self.value(expr))
            return seen[-1] == wanted

        try:
            wait_for(check, f"Prometheus to answer {expr} = {wanted:g}", timeout=timeout, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; values seen: {seen[-10:]}") from None


@contextlib.contextmanager
def prometheus(processes: Processes, targets: Sequence[Target]) -> Iterator[Prometheus]:
    """Start Prometheus (Debian's package) with a generated scrape config; wait until every target is up."""
    binary, promtool = tools.prometheus(), tools.promtool()
    workdir = processes.workdir / "prometheus"
    workdir.mkdir()
    jobs: dict[str, dict[str, Any]] = {}
    for target in targets:
        job = jobs.setdefault(
            target.job,
            {
                "job_name": target.job,
                "honor_labels": target.honor_labels,
                "metrics_path": "/metrics",
                "static_configs": [],
            },
        )
        job["static_configs"].append({"targets": [target.address], "labels": target.labels})
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": list(jobs.values()),
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [promtool, "check", "config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, f"promtool rejects the generated config:\n{check.stdout}{check.stderr}"
    (port,) = free_ports(1)
    proc = processes.start(
        "prometheus",
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        env=clean_env(),
        cwd=workdir,
    )
    server = Prometheus(f"http://127.0.0.1:{port}", proc)

    def ready() -> bool:
        proc.alive()
        return http_ok(f"{server.url}/-/ready")

    wait_for(ready, "Prometheus to be ready", timeout=60, interval=0.2)
    wanted = len(targets)
    wait_for(
        lambda: server.value("sum(up)") == wanted,
        f"Prometheus to scrape all {wanted} targets",
        timeout=30,
        interval=0.3,
    )
    try:
        yield server
    finally:
        proc.stop()


# -- the scenario -----------------------------------------------------------------------------------------


@dataclass
class Orders:
    """The orders published by the scenario: good ones with an id, and one malformed (no id)."""

    good: list[dict[str, Any]]
    poison: dict[str, Any]

    @classmethod
    def make(cls, count: int) -> Orders:
        run = uuid.uuid4().hex[:8]
        good = [{"id": f"{run}-{i}", "amount": i * 10} for i in range(count)]
        return cls(good, {"note": f"{run}: an order without an id can never succeed"})

    @property
    def total(self) -> int:
        return len(self.good) + 1


def publish(sidecar_url: str, orders: Orders) -> None:
    """Publish every order through the sidecar; returns once all are durable."""
    with Client(sidecar_url, timeout=30) as client:
        client.publish_batch(TOPIC, [message(o, key=o["id"]) for o in orders.good])
        client.publish_batch(TOPIC, [message(orders.poison)])


def processed_ids(worker_log: str) -> set[str]:
    """Order ids the example push worker logged as processed."""
    ids = set()
    for line in worker_log.splitlines():
        if "processed (delivery" in line:
            ids.add(line.split("order ", 1)[1].split(" processed", 1)[0])
    return ids


def wait_consumed(
    kubectl: Kubectl, orders: Orders, worker_log: Callable[[], str], timeout: float = 90
) -> None:
    """Every good order processed by the worker; the Consumer's status shows nothing left, one dead letter."""
    wanted = {str(o["id"]) for o in orders.good}  # the log shows ids as text, whatever their JSON type
    wait_for(
        lambda: wanted <= processed_ids(worker_log()),
        f"the worker to process all {len(wanted)} orders",
        timeout=timeout,
        interval=0.3,
    )

    def settled() -> dict[str, Any] | None:
        status = kubectl.get("consumer", CONSUMER, NAMESPACE).get("status") or {}
        done = status.get("backlog") == 0 and status.get("inFlight") == 0 and status.get("deadLettered") == 1
        return status if done else None

    wait_for(
        settled,
        "the Consumer status to show backlog 0, in flight 0, 1 dead-lettered",
        timeout=timeout,
        interval=0.5,
    )


def dead_letters(settings: Settings, namespace: str = NAMESPACE) -> list[Any]:
    """What the dead-letter topic holds, read with the library under the namespace's root prefix."""

    async def read() -> list[Any]:
        root = f"{settings.root}/{namespace}" if settings.root else namespace
        async with Bucketq(settings.model_copy(update={"root": root})) as bq:
            consumer = await bq.register_consumer(f"e2e-audit-{uuid.uuid4().hex[:6]}", topics=[DLQ])
            found: list[Any] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not found:
                found = list(await consumer.poll(max_messages=10, wait=2))
            return found

    return asyncio.run(read())


def check_dead_letter(settings: Settings, orders: Orders) -> None:
    letters = dead_letters(settings)
    assert [m.payload for m in letters] == [orders.poison], f"the dead-letter topic holds {letters!r}"
    headers = letters[0].headers
    assert TOPIC in headers.values() and CONSUMER in headers.values(), f"no origin headers: {headers}"


def check_metrics(prom: Prometheus, orders: Orders) -> None:
    """PromQL over the operator's queue metrics and the sidecar's own, after everything is consumed."""
    sel = f'namespace="{NAMESPACE}",topic="{TOPIC}"'
    prom.wait_value(f"sum(bucketq_topic_published_messages_total{{{sel}}})", orders.total)
    prom.wait_value(f'sum(bucketq_subscription_backlog{{{sel},consumer="{CONSUMER}"}})', 0)
    prom.wait_value(f'sum(bucketq_subscription_dead_lettered_total{{{sel},consumer="{CONSUMER}"}})', 1)
    prom.wait_value(
        f'sum(bucketq_messages_acked_total{{namespace="{NAMESPACE}",topic="{TOPIC}"}})', len(orders.good)
    )
