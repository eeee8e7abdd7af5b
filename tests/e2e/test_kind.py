"""The Kubernetes quickstart, step by step, on a real cluster (kind), for machines with Docker: ``make e2e``.

Runs the commands of docs/quickstart-kubernetes.md as the page writes them, from the repository's
root, so every manifest applied is a file of examples/quickstart/: the image built and loaded into
kind (step 1's kind block), SeaweedFS and its bucket, the credentials, the chart, the Topic, the
DeadLetterPolicy and the Consumer, the push worker (its pod gets the sidecar from the webhook), the
doc's publish, log and status commands, and finally its clean-up. Between step 8 and the clean-up
it runs the scenario shared with the local e2e: orders published through the worker pod's sidecar
(with the doc's own publish command) are all processed, the malformed one lands in the
dead-letter topic, and a real Prometheus (scraping through port-forwards) shows it. The doc
commands it changes or leaves out are listed below (``INSTALL_OVERRIDES``, ``is_keda``).

Skipped unless BUCKETQ_E2E_KIND=1; asked for, a missing Docker or kind fails it
(BUCKETQ_TEST_SKIP=kind skips it instead: tests/support/tools.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.e2e_helpers import (
    CONSUMER,
    DLQ,
    NAMESPACE,
    SIDECAR,
    TOPIC,
    Kubectl,
    Orders,
    Processes,
    Target,
    check_metrics,
    prometheus,
    wait_consumed,
)
from tests.operator.harness import wait_for
from tests.ship.chart_tools import (
    CHART,
    OLDEST_KUBE,
    REPO,
    one,
    tool,
    validate_kubernetes,
)
from tests.ship.test_quickstart import (
    blocks,
    files_of,
    is_manifest,
    manifests,
    option,
    render_command,
    shell_commands,
    yaml_files,
)
from tests.support.servers import free_ports
from tests.support.tools import missing

ORDERS = 40
# The only doc command the kind test changes: extra flags on the doc's `helm install`.
#   operator.statusIntervalSeconds=2  the Consumer's status (backlog, in flight, dead-lettered) is
#                                     refreshed every 2 s instead of 30 s, so the checks settle soon.
# No image override: step 1's kind block builds and loads the chart's default image
# (ghcr.io/bucketq/bucketq:appVersion, pullPolicy IfNotPresent), which worker.yaml names too. No
# bucket override: the cluster is new, so the doc's `s3.bucket.create -name bucketq` runs as is.
INSTALL_OVERRIDES = ("--set", "operator.statusIntervalSeconds=2")
STEP_TIMEOUT = 600  # seconds; the doc's own --timeout flags (at most 5m) are shorter


@dataclass(frozen=True)
class Step:
    """A quickstart command (``doc``) and how the kind test runs it (``run``; None: not run, see ``why``)."""

    doc: list[str]
    run: list[str] | None
    why: str = ""


def is_keda(command: list[str]) -> bool:
    """Step 8's KEDA commands: the quickstart runs them only "with KEDA installed", which kind has not
    (the chart refuses the ScaledObject without KEDA's CRD; tests/ship renders that upgrade)."""
    upgrade = command[:2] == ["helm", "upgrade"] and any("keda" in f for f in files_of(command))
    return upgrade or "scaledobject" in command


def is_cleanup(command: list[str]) -> bool:
    """Step 9: the checks of the scenario run before the first of these."""
    return (command[:1] == ["kubectl"] and "delete" in command) or command[:2] == ["helm", "uninstall"]


def quickstart_steps() -> list[Step]:
    """Every command of the quickstart's sh blocks, in order, as the kind test runs it."""
    steps = []
    for command in shell_commands(blocks()):
        if is_keda(command):
            steps.append(Step(command, None, "KEDA is not installed on the kind cluster"))
        elif command[:2] == ["helm", "install"]:
            steps.append(Step(command, [*command, *INSTALL_OVERRIDES]))
        else:
            steps.append(Step(command, command))
    return steps


def image_steps(cluster: str) -> list[Step]:
    """Step 1's kind block (skipped by tests/ship): `make image`, then `kind load` into this cluster."""
    kind_block = [replace(b, skip=False) for b in blocks() if b.skip]
    steps = []
    for command in shell_commands(kind_block):
        if command[:2] == ["kind", "load"]:
            steps.append(Step(command, [*command, "--name", cluster]))  # the test's cluster, not "kind"
        else:
            steps.append(Step(command, command))
    return steps


def one_command(steps: list[Step], what: str, match: Any) -> list[str]:
    found = [s.doc for s in steps if s.run is not None and match(s.doc)]
    assert len(found) == 1, f"the quickstart should have one {what} command, found {found}"
    return found[0]


def publish_command(steps: list[Step]) -> list[str]:
    """Step 7's `kubectl exec ... -- bucketq publish orders PAYLOAD`."""
    return one_command(steps, "publish", lambda c: "exec" in c and "publish" in c)


def sidecar_name_command(steps: list[Step]) -> list[str]:
    """Step 6's last command, which prints the first init container's name: the sidecar."""
    return one_command(steps, "init container", lambda c: "initContainers" in (option(c, "-o") or ""))


def worker_logs_command(steps: list[Step]) -> list[str]:
    """Step 7's `kubectl logs` of the worker container."""
    return one_command(steps, "worker log", lambda c: "logs" in c)


def exec_prefix(publish: list[str]) -> list[str]:
    """The publish command up to ``bucketq``: a CLI run in the sidecar, with the namespace's settings."""
    return publish[: publish.index("--") + 2]


def scenario_publish(publish: list[str], orders: Orders) -> list[str]:
    """The doc's publish command with the scenario's orders as its payloads (one message each)."""
    start = publish.index("publish") + 2  # after the topic
    assert publish[start - 1] == TOPIC, publish
    return [*publish[:start], *(json.dumps(o) for o in [*orders.good[1:], orders.poison])]


def doc_order(publish: list[str]) -> dict[str, Any]:
    payload = json.loads(publish[publish.index("publish") + 2])
    assert isinstance(payload, dict) and "id" in payload, payload
    return payload


def expected_log_line() -> str:
    """The worker log line the doc shows after its publish (its ``text`` block, without the "...")."""
    (text,) = [b.text for b in blocks() if b.lang == "text"]
    line = text.strip().splitlines()[-1]
    return line.removeprefix("... ")


def quickstart_objects() -> list[dict[str, Any]]:
    return [d for p in yaml_files() if is_manifest(p) for d in manifests(p)]


def quickstart_namespaces() -> list[str]:
    return [d["metadata"]["name"] for d in quickstart_objects() if d["kind"] == "Namespace"]


def worker() -> dict[str, Any]:
    return one(quickstart_objects(), "Deployment", "billing-worker")


def chart_values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


# -- checked everywhere (no cluster needed), since the kind e2e runs rarely --------------------------------


@pytest.mark.e2e  # a kubernetes-validate process
def test_kind_manifests_are_valid_kubernetes(tmp_path: Path) -> None:
    """The quickstart files the kind test applies: every manifest file, valid for the oldest Kubernetes."""
    runs = [s.run for s in quickstart_steps() if s.run is not None]
    applied = [p for r in runs if r[:1] == ["kubectl"] and "apply" in r for p in files_of(r)]
    manifest_files = {p for p in yaml_files() if is_manifest(p)}
    assert set(applied) == manifest_files, f"applied {applied}, the quickstart's manifests {manifest_files}"
    assert all(p.startswith("examples/quickstart/") for p in applied)
    values = [p for r in runs if r[:1] == ["helm"] for p in files_of(r)]
    assert values == ["examples/quickstart/values.yaml"], f"helm gets {values} (keda-values needs KEDA)"
    docs = [d for p in applied for d in manifests(p) if not d["apiVersion"].startswith("bucketq.io/")]
    result = validate_kubernetes(docs, OLDEST_KUBE, tmp_path / "kind-e2e.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == len(docs)
    assert {d["kind"] for d in docs} >= {"Namespace", "Secret", "Deployment", "Service", "ConfigMap"}


@pytest.mark.e2e  # a helm process (the overridden install renders)
def test_kind_steps_are_the_quickstarts_commands() -> None:
    """The kind test runs every doc command verbatim but the listed overrides and the KEDA ones."""
    steps = quickstart_steps()
    assert [s.doc for s in steps] == shell_commands(blocks())
    for step in steps:
        if step.run is None:
            assert is_keda(step.doc) and step.why, step
        elif step.doc[:2] == ["helm", "install"]:
            assert step.run == [*step.doc, *INSTALL_OVERRIDES]
        else:
            assert step.run == step.doc, step
    assert [s.doc[:2] for s in steps if s.run is None] == [["helm", "upgrade"], ["kubectl", "-n"]]
    # The overridden install renders with the real helm (values.schema.json accepts the overrides).
    (install,) = [s.run for s in steps if s.run and s.run[:2] == ["helm", "install"]]
    operator = [
        c
        for d in render_command(install)
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "operator"
    ]
    (container,) = operator
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["BUCKETQ_OPERATOR_STATUS_INTERVAL_S"] == "2", "the override reaches the operator"
    # The scenario's hooks find their doc commands, and the scenario's publish is the doc's.
    publish = publish_command(steps)
    assert exec_prefix(publish)[-4:] == ["-c", SIDECAR, "--", "bucketq"], publish
    orders = Orders([doc_order(publish), {"id": "a"}], {"note": "no id"})
    assert scenario_publish(publish, orders)[: len(publish) - 1] == publish[:-1]
    assert scenario_publish(publish, orders)[-2:] == ['{"id": "a"}', '{"note": "no id"}']
    assert sidecar_name_command(steps)[:3] == ["kubectl", "-n", NAMESPACE]
    assert f"-c {worker()['spec']['template']['spec']['containers'][0]['name']}" in " ".join(
        worker_logs_command(steps)
    )
    assert expected_log_line() == f"push-worker: order {doc_order(publish)['id']} processed (delivery 1)"
    assert any(is_cleanup(s.doc) for s in steps)


def test_kind_loads_the_image_the_chart_and_worker_run() -> None:
    """Step 1's kind block builds and loads the image the chart and worker.yaml use by default, so the
    kind test needs no image override."""
    steps = image_steps("bucketq-e2e-x")
    assert [s.doc[:2] for s in steps] == [["make", "image"], ["kind", "load"]]
    image = steps[1].doc[-1]
    values = chart_values()["image"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert image == f"{values['repository']}:{app_version}" and values["pullPolicy"] == "IfNotPresent"
    assert chart_values()["sidecar"]["image"] == "", "the sidecar runs the chart's image"
    assert worker()["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert steps[1].run == [*steps[1].doc, "--name", "bucketq-e2e-x"]
    dry = subprocess.run(["make", "-s", "-n", "image"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and f"-t {image} " in f"{dry.stdout} ", f"make image tags: {dry.stdout}"


# -- on kind -----------------------------------------------------------------------------------------------


def _require_kind() -> None:
    """Skip unless asked for (``make e2e``: it builds an image and a cluster); asked for, a missing
    Docker or kind fails the test (``BUCKETQ_TEST_SKIP=kind`` skips it instead)."""
    if os.environ.get("BUCKETQ_E2E_KIND") != "1":
        pytest.skip(
            "the kind e2e runs with `make e2e` (BUCKETQ_E2E_KIND=1): it builds an image and a cluster"
        )
    if shutil.which("docker") is None:
        missing("kind", "docker", "install Docker (https://docs.docker.com/engine/install/)")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False).returncode != 0:
        missing("kind", "a reachable Docker engine", "start Docker (`docker info` fails)")
    if shutil.which("kind") is None:
        missing("kind", "kind", "install it from https://kind.sigs.k8s.io")


def run(args: list[str], kubeconfig: Path | None = None, check: bool = True) -> str:
    """A doc command from the repository's root (its paths are relative to it), on the test's cluster."""
    env = dict(os.environ)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)  # kubectl and helm both read it: the commands stay verbatim
    binary = tool(args[0]) if args[0] in ("kubectl", "helm") else args[0]
    result = subprocess.run(
        [binary, *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    if check:
        assert result.returncode == 0, (
            f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return result.stdout


@contextlib.contextmanager
def port_forward(
    kubectl: Kubectl, processes: Processes, target: str, namespace: str, port: int
) -> Iterator[int]:
    (local,) = free_ports(1)
    proc = processes.start(
        f"port-forward-{target.replace('/', '-')}-{port}",
        [
            kubectl.binary,
            "--kubeconfig",
            str(kubectl.kubeconfig),
            "port-forward",
            "-n",
            namespace,
            "--address",
            "127.0.0.1",
            target,
            f"{local}:{port}",
        ],
        env=dict(os.environ),
    )
    wait_for(
        lambda: "Forwarding from" in proc.log(), f"port-forward to {target}:{port}", timeout=30, interval=0.2
    )
    try:
        yield local
    finally:
        proc.stop()


@pytest.fixture
def kind_cluster(tmp_path: Path) -> Iterator[Kubectl]:
    _require_kind()
    name = f"bucketq-e2e-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "kubeconfig"
    run(["kind", "create", "cluster", "--name", name, "--kubeconfig", str(config), "--wait", "180s"])
    try:
        for step in image_steps(name):
            assert step.run is not None
            run(step.run)
        yield Kubectl(tool("kubectl"), config)
    finally:
        run(["kind", "delete", "cluster", "--name", name])


@pytest.mark.e2e
@pytest.mark.slow
def test_kind_end_to_end(kind_cluster: Kubectl, tmp_path: Path) -> None:
    kubectl = kind_cluster
    processes = Processes(tmp_path)
    try:
        quickstart(kubectl, processes)
    except BaseException:
        print(processes.logs())
        for ns in quickstart_namespaces():
            print(kubectl("get", "all,events", "-n", ns, check=False))
        raise
    finally:
        processes.stop_all()


def quickstart(kubectl: Kubectl, processes: Processes) -> None:
    steps = quickstart_steps()
    publish = publish_command(steps)
    made = Orders.make(ORDERS)
    # The doc's own order first (published by its verbatim command), then the scenario's.
    orders = Orders([doc_order(publish), *made.good], made.poison)
    checked = False
    for step in steps:
        if step.run is None:
            continue
        if is_cleanup(step.doc) and not checked:
            scenario(kubectl, processes, steps, orders)
            checked = True
        if step.doc == worker_logs_command(steps):
            # The log lags the publish: the doc's command, until it shows the line the doc shows.
            line = expected_log_line()
            wait_for(
                partial(log_shows, step.doc, kubectl.kubeconfig, line),
                f"the worker log to show {line!r}",
                timeout=90,
                interval=1,
            )
            continue
        out = run(step.run, kubectl.kubeconfig)
        if step.doc == sidecar_name_command(steps):
            assert out.strip() == SIDECAR, f"the webhook did not inject the sidecar first: {out!r}"
        if step.doc == publish:
            run(scenario_publish(publish, orders), kubectl.kubeconfig)
    assert checked, "the quickstart has no clean-up step"
    existing = {n.removeprefix("namespace/") for n in kubectl("get", "namespaces", "-o", "name").split()}
    assert not existing & set(quickstart_namespaces()), f"the clean-up left {existing}"


def log_shows(command: list[str], kubeconfig: Path, line: str) -> bool:
    return line in run(command, kubeconfig, check=False)


def scenario(kubectl: Kubectl, processes: Processes, steps: list[Step], orders: Orders) -> None:
    """Every order processed, the malformed one dead-lettered, and Prometheus showing both."""
    deployment = worker()
    labels = deployment["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    pod_name = kubectl(
        "get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "jsonpath={.items[0].metadata.name}"
    ).strip()
    pod = kubectl.get("pod", pod_name, NAMESPACE)
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == SIDECAR)
    assert sidecar.get("restartPolicy") == "Always", "a native sidecar"
    app = next(c for c in pod["spec"]["containers"] if c["name"] != SIDECAR)
    sidecar_values = chart_values()["sidecar"]
    api_port, metrics_port = sidecar_values["apiPort"], sidecar_values["metricsPort"]
    assert (api_port, metrics_port) == (3580, 9580)
    url = {e["name"]: e.get("value") for e in app.get("env") or []}.get("BUCKETQ_SIDECAR_URL")
    assert url == f"http://127.0.0.1:{api_port}", f"the app's sidecar URL: {url}"

    logs = worker_logs_command(steps)
    wait_consumed(kubectl, orders, lambda: run(logs, kubectl.kubeconfig, check=False))
    check_dead_letter_in_sidecar(kubectl, exec_prefix(publish_command(steps)), orders)

    (install,) = [s.doc for s in steps if s.doc[:2] == ["helm", "install"]]
    release, release_ns = install[2], option(install, "--namespace", "-n")
    assert release_ns is not None
    operator_metrics = chart_values()["operator"]["metricsPort"]
    with (
        port_forward(kubectl, processes, f"pod/{pod_name}", NAMESPACE, metrics_port) as sidecar_metrics,
        port_forward(
            kubectl, processes, f"svc/{release}-bucketq-metrics", release_ns, operator_metrics
        ) as op_metrics,
    ):
        targets = [
            Target("bucketq-operator", f"127.0.0.1:{op_metrics}", honor_labels=True),
            Target(
                "bucketq-sidecars", f"127.0.0.1:{sidecar_metrics}", {"namespace": NAMESPACE, "pod": pod_name}
            ),
        ]
        with prometheus(processes, targets) as prom:
            check_metrics(prom, orders)


def check_dead_letter_in_sidecar(kubectl: Kubectl, bucketq: list[str], orders: Orders) -> None:
    """The dead-letter topic holds the malformed order, read by the CLI in the worker's sidecar (the
    namespace's own key and root), with its origin in the headers."""
    audit = f"e2e-audit-{uuid.uuid4().hex[:6]}"
    command = [*bucketq, "consume", DLQ, "--consumer", audit, "--json", "--max", "10", "--wait", "10"]
    letters = [json.loads(line) for line in run(command, kubectl.kubeconfig).splitlines() if line.strip()]
    assert [m.get("payload") for m in letters] == [orders.poison], f"the dead-letter topic holds {letters!r}"
    headers = letters[0]["headers"]
    assert TOPIC in headers.values() and CONSUMER in headers.values(), f"no origin headers: {headers}"
