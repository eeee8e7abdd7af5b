"""End to end on a local "cluster": the Kubernetes API emulator, and every pod a set of local processes.

What a cluster would do, done here by the test, and nothing else:

* the apiserver: the kmock-based emulator of the operator tests, on 127.0.0.1; the chart's CRDs and
  the example custom resources go in with ``kubectl apply``, their status is read with ``kubectl get``
  (namespaces and Secrets are set up through the API: kubectl cannot create built-in kinds there);
* the chart: ``helm template`` renders it; the operator Deployment's and the webhook Deployment's
  containers are started as processes with exactly their args and environment (Secrets resolved
  from the emulator, the webhook certificate Secret "mounted" into a folder), each with the
  identity of its own ServiceAccount;
* the admission chain: the example worker pod goes through the chart's MutatingWebhookConfiguration
  selectors (namespace, object, CEL match conditions): exactly one webhook takes it, and calls the
  webhook process over HTTPS, verified with the configuration's caBundle under the Service's DNS
  name; the JSON patch is applied;
* the kubelet: the mutated pod's native sidecar and app container run as processes with the
  environment the spec gives them (fieldRef, secretKeyRef, $(VAR) expansion), probes polled;
* Prometheus: the real server, scraping the operator and the sidecar.

At the end, every API call the operator and the webhook made (the emulator's request log, told apart
by their tokens) must be granted by the chart's RBAC to their ServiceAccounts, and every grant but
``events: create`` (kopf posts events only about failures) used.

Storage is SeaweedFS. The example push worker stands in for the example Deployment's app image.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import socket
import ssl
import sys
import uuid
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import pytest
import yaml

from bucketq.config import Settings
from tests.e2e.e2e_helpers import (
    CONSUMER,
    CUSTOM_RESOURCES,
    EXAMPLES,
    NAMESPACE,
    SIDECAR,
    TOPIC,
    WORKER,
    Kubectl,
    Orders,
    Processes,
    Target,
    check_dead_letter,
    check_metrics,
    clean_env,
    example,
    http_ok,
    kubeconfig,
    prometheus,
    publish,
    wait_consumed,
    worker_command,
)
from tests.operator.harness import Kube, wait_for
from tests.operator.k8s_emulator import EmulatorThread
from tests.ship.chart_tools import (
    CHART,
    component,
    container_env,
    granted,
    one,
    operator_container,
    render,
    secret_data,
    selector_matches,
    tool,
    webhook_container,
)
from tests.support.servers import S3Server, free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.s3]

RELEASE, RELEASE_NS = "bq", "bucketq-system"
BUCKETQ = [sys.executable, "-m", "bucketq.cli"]  # the image's ENTRYPOINT ["bucketq"]
ORDERS = 40


def namespace_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
    }


def secret_manifest(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": encoded,
    }


def create(kube: Kube, *docs: dict[str, Any]) -> None:
    """Cluster set-up (namespaces, Secrets) through the API as any client would."""
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        plural = doc["kind"].lower() + "s"
        kube.request(
            "POST", f"/api/v1/namespaces/{namespace}/{plural}" if namespace else f"/api/v1/{plural}", doc
        )


def read_secret(kube: Kube, name: str, namespace: str) -> dict[str, str]:
    """A Secret's data as the kubelet reads it for secretKeyRef."""
    secret = kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def mount_volumes(
    pod_spec: dict[str, Any], container: dict[str, Any], docs: list[dict[str, Any]], root: Path
) -> dict[str, str]:
    """Write the container's Secret volumes into folders; returns mountPath -> local folder."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or ()}
    mounts: dict[str, str] = {}
    for mount in container.get("volumeMounts") or ():
        volume = volumes[mount["name"]]
        if "secret" not in volume:
            continue  # emptyDir: the process has the machine's /tmp
        secret = one(docs, "Secret", volume["secret"]["secretName"])
        folder = root / mount["name"]
        folder.mkdir(parents=True)
        for key, value in secret_data(secret).items():
            (folder / key).write_bytes(value)
        mounts[mount["mountPath"]] = str(folder)
    return mounts


def remap(env: dict[str, str], mounts: dict[str, str]) -> dict[str, str]:
    out = {}
    for name, value in env.items():
        for path, folder in mounts.items():
            if value == path or value.startswith(path + "/"):
                value = folder + value[len(path) :]
        out[name] = value
    return out


def pod_from_template(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The pod the ReplicaSet controller would create from the Deployment's template."""
    template = copy.deepcopy(deployment["spec"]["template"])
    meta = template.get("metadata") or {}
    name = deployment["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{name}-5c6f7d9b8-",
            "namespace": namespace,
            "labels": {**(meta.get("labels") or {}), "pod-template-hash": "5c6f7d9b8"},
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": template["spec"],
    }


def sent_to_webhook(
    webhook: dict[str, Any], pod: dict[str, Any], namespace_labels: dict[str, str]
) -> list[str]:
    """Why the apiserver would not send ``pod`` to ``webhook`` (empty: it would)."""
    reasons = []
    if not selector_matches(webhook.get("namespaceSelector") or {}, namespace_labels):
        reasons.append(f"namespaceSelector {webhook.get('namespaceSelector')} excludes {namespace_labels}")
    if not selector_matches(webhook.get("objectSelector") or {}, pod["metadata"].get("labels") or {}):
        reasons.append(
            f"objectSelector {webhook.get('objectSelector')} excludes labels {pod['metadata'].get('labels')}"
        )
    env = celpy.Environment()
    for condition in webhook.get("matchConditions") or ():
        program = env.program(env.compile(condition["expression"]))
        if not bool(program.evaluate({"object": celpy.json_to_cel(pod)})):
            reasons.append(f"matchCondition {condition['name']} is false")
    return reasons


def review_pod(webhook: dict[str, Any], port: int, pod: dict[str, Any]) -> dict[str, Any]:
    """POST the AdmissionReview as the apiserver does (HTTPS, the caBundle trusted, the Service's DNS
    name); returns the webhook's response."""
    import aiohttp

    service = webhook["clientConfig"]["service"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(webhook["clientConfig"]["caBundle"]).decode()
    )
    uid = str(uuid.uuid4())
    review: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }

    async def post() -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"https://127.0.0.1:{port}{service['path']}",
                json=review,
                ssl=context,
                server_hostname=f"{service['name']}.{service['namespace']}.svc",
                timeout=aiohttp.ClientTimeout(total=webhook["timeoutSeconds"]),
            ) as resp,
        ):
            assert resp.status == 200, f"webhook answered HTTP {resp.status}: {await resp.text()}"
            body: dict[str, Any] = await resp.json()
            return body

    answer: dict[str, Any] = asyncio.run(post())["response"]
    assert answer["uid"] == uid, f"the answer is to another review: {answer}"
    return answer


def admit(webhook: dict[str, Any], port: int, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the webhook mutated it (it must admit it)."""
    answer = review_pod(webhook, port, pod)
    assert answer["allowed"], f"the webhook refused the pod: {answer}"
    assert answer.get("patchType") == "JSONPatch", f"the webhook did not mutate the pod: {answer}"
    patch = json.loads(base64.b64decode(answer["patch"]))
    mutated: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    return mutated


def identity(kubectl: Kubectl, service_account: str, path: Path) -> Path:
    """A kubeconfig like kubectl's whose bearer token names ``service_account`` (one per process)."""
    config = yaml.safe_load(kubectl.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": service_account}
    path.write_text(yaml.safe_dump(config))
    return path


def api_calls(emulator: EmulatorThread, agent: str, token: str) -> set[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of every resource request from ``agent`` with ``token``."""
    assert emulator.emulator is not None
    calls = set()
    for request in list(emulator.emulator._requests):
        if agent not in (request.headers.get("User-Agent") or "") or request.resource is None:
            continue
        if request.headers.get("Authorization") != f"Bearer {token}":
            continue
        if request.resource.plural is None:
            continue  # discovery: allowed to every authenticated user (system:discovery)
        method = str(getattr(request.method, "value", request.method)).upper()
        if method == "GET":
            verb = (
                "watch"
                if request.params.get("watch") in ("true", "1")
                else "list"
                if request.name is None
                else "get"
            )
        else:
            verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        calls.add((request.resource.group or "", resource, verb))
    return calls


def can_listen(port: int) -> bool:
    """Whether a server (which sets SO_REUSEADDR, as aiohttp does) can listen on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def emulator() -> Any:
    thread = EmulatorThread().start()
    try:
        yield thread
    finally:
        thread.stop()


def test_local_cluster_end_to_end(
    seaweedfs_server: S3Server, emulator: EmulatorThread, tmp_path: Path
) -> None:
    assert can_listen(8080), "port 8080 (the example Consumer's push port) is in use on this machine"
    processes = Processes(tmp_path)
    kubectl = Kubectl(tool("kubectl"), kubeconfig(tmp_path / "kubeconfig", emulator.url))
    try:
        run_scenario(seaweedfs_server, emulator, kubectl, processes, tmp_path)
    except BaseException:
        print(processes.logs())
        raise
    finally:
        processes.stop_all()


def run_scenario(
    s3: S3Server, emulator: EmulatorThread, kubectl: Kubectl, processes: Processes, tmp_path: Path
) -> None:
    # -- the cluster: CRDs from the chart, namespaces, the S3 credentials Secrets ---------------------
    # --validate=false: kubectl's schema check downloads /openapi/v3, which the emulator does not serve;
    # the emulator validates custom resources itself (schema, CEL) and the chart tests check the examples.
    kubectl("apply", "--validate=false", "-f", str(CHART / "crds"))
    bucket = s3.new_bucket()
    credentials = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    kube = Kube(emulator.url)
    create(
        kube,
        namespace_manifest(RELEASE_NS),
        namespace_manifest(NAMESPACE),
        secret_manifest("bucketq-s3", RELEASE_NS, credentials),
        secret_manifest("bucketq-s3", NAMESPACE, credentials),
    )

    # -- the operator, as the chart's Deployment runs it ------------------------------------------------
    op_metrics, op_health, webhook_port, wh_health, sc_api, sc_metrics = free_ports(6)
    values = {
        "s3": {"bucket": bucket, "endpointUrl": s3.endpoint_url},
        "operator": {
            "statusIntervalSeconds": 1,
            "metricsPort": op_metrics,
            "healthPort": op_health,
            "extraEnv": [{"name": "BUCKETQ_OPERATOR_METRICS_HOST", "value": "127.0.0.1"}],
        },
        "webhook": {
            "port": webhook_port,
            "healthPort": wh_health,
            "extraEnv": [{"name": "BUCKETQ_OPERATOR_WEBHOOK_ADDR", "value": "127.0.0.1"}],
        },
        "sidecar": {"apiPort": sc_api, "metricsPort": sc_metrics},
    }
    docs = render(values, namespace=RELEASE_NS, release=RELEASE)
    deployment = component(docs, "Deployment", "operator")
    pod_spec = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    secrets = {"bucketq-s3": read_secret(kube, "bucketq-s3", RELEASE_NS)}
    mounts = mount_volumes(pod_spec, container, docs, tmp_path / "operator-volumes")
    pod_fields = {"metadata.name": f"{RELEASE}-bucketq-7c9d6-x2x4q", "metadata.namespace": RELEASE_NS}
    env = remap(container_env(container, secrets, pod_fields), mounts)
    op_identity = identity(kubectl, pod_spec["serviceAccountName"], tmp_path / "operator.kubeconfig")
    operator = processes.start(
        "operator", [*BUCKETQ, *container["args"]], clean_env(**env, KUBECONFIG=str(op_identity))
    )
    probe = container["startupProbe"]["httpGet"]
    health = f"http://127.0.0.1:{op_health}{probe['path']}"

    def operator_up() -> bool:
        operator.alive()
        return http_ok(health) and http_ok(f"http://127.0.0.1:{op_metrics}/metrics")

    wait_for(operator_up, "the operator's health and metrics endpoints", timeout=60, interval=0.3)

    # -- one replica of the webhook, as the chart's webhook Deployment runs it (no Secret but its TLS) ---
    wh_pod_spec = component(docs, "Deployment", "webhook")["spec"]["template"]["spec"]
    wh_container = webhook_container(docs)
    wh_mounts = mount_volumes(wh_pod_spec, wh_container, docs, tmp_path / "webhook-volumes")
    wh_env = remap(container_env(wh_container), wh_mounts)
    wh_identity = identity(kubectl, wh_pod_spec["serviceAccountName"], tmp_path / "webhook.kubeconfig")
    webhook_proc = processes.start(
        "webhook", [*BUCKETQ, *wh_container["args"]], clean_env(**wh_env, KUBECONFIG=str(wh_identity))
    )
    assert wh_container["readinessProbe"]["tcpSocket"]["port"] == "webhook"

    def webhook_up() -> bool:
        webhook_proc.alive()
        with socket.socket() as sock:
            sock.settimeout(1)
            listening = sock.connect_ex(("127.0.0.1", webhook_port)) == 0
        return listening and http_ok(f"http://127.0.0.1:{wh_health}/healthz")

    wait_for(webhook_up, "the webhook's port and health endpoint", timeout=60, interval=0.3)

    # -- the example custom resources ------------------------------------------------------------------
    files = [a for name in CUSTOM_RESOURCES for a in ("-f", str(EXAMPLES / name))]
    kubectl("apply", "--validate=false", "-n", NAMESPACE, *files)
    for name in CUSTOM_RESOURCES:
        doc = example(name)
        kubectl.wait_phase(doc["kind"].lower(), doc["metadata"]["name"], NAMESPACE)

    # -- the worker pod through the admission chain ----------------------------------------------------
    pod = pod_from_template(example(WORKER), NAMESPACE)
    namespace_labels = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}")["metadata"].get("labels") or {}
    webhooks = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    reasons = {w["name"]: sent_to_webhook(w, pod, namespace_labels) for w in webhooks}
    taking = [w for w in webhooks if not reasons[w["name"]]]
    assert len(taking) == 1, (
        f"the apiserver must send the pod of examples/{WORKER} to exactly one of the chart's webhooks "
        f"(its pod template needs the label bucketq.io/consumer): {reasons}"
    )
    (webhook,) = taking
    mutated = admit(webhook, webhook_port, pod)
    pod_name = f"{pod['metadata']['generateName']}x7k2p"
    spec = mutated["spec"]
    sidecars = [c for c in spec.get("initContainers") or () if c["name"] == SIDECAR]
    assert sidecars and sidecars[0].get("restartPolicy") == "Always", f"no native sidecar injected: {spec}"
    assert mutated["metadata"]["annotations"].get("bucketq.io/injected") == "true"
    # a pod naming a Consumer nobody applied: the webhook, not finding it in its index, asks the
    # API server (a get the chart grants) before it refuses the pod
    stray = pod_from_template(example(WORKER), NAMESPACE)
    stray["metadata"]["labels"]["bucketq.io/consumer"] = "nobody-applied-this"
    refused = review_pod(webhook, webhook_port, stray)
    assert not refused["allowed"] and "does not exist" in refused["status"]["message"], refused

    # -- the kubelet: the native sidecar first, then the app ------------------------------------------
    # the pod's processes run on this host: its IP (where producers ping the sidecar) is loopback
    fields = {"metadata.namespace": NAMESPACE, "metadata.name": pod_name, "status.podIP": "127.0.0.1"}
    pod_secrets = {"bucketq-s3": read_secret(kube, "bucketq-s3", NAMESPACE)}
    sidecar = sidecars[0]
    assert sidecar["image"] == container["image"], "the sidecar runs the operator's image"
    assert sidecar["command"][0] == "bucketq", f"the sidecar command is {sidecar['command']}"
    sidecar_env = container_env(sidecar, pod_secrets, fields)
    sidecar_proc = processes.start(
        "sidecar", [*BUCKETQ, *sidecar["command"][1:], *(sidecar.get("args") or [])], clean_env(**sidecar_env)
    )

    def probe_ok(name: str) -> bool:
        sidecar_proc.alive()
        http = sidecar[name]["httpGet"]
        return http_ok(f"http://127.0.0.1:{http['port']}{http['path']}")

    wait_for(lambda: probe_ok("startupProbe"), "the sidecar's startup probe", timeout=60, interval=0.2)
    wait_for(lambda: probe_ok("readinessProbe"), "the sidecar's readiness probe", timeout=60, interval=0.2)

    (app,) = [c for c in spec["containers"] if c["name"] != SIDECAR]
    app_env = container_env(app, pod_secrets, fields)
    orders = Orders.make(ORDERS)
    publish(app_env["BUCKETQ_SIDECAR_URL"], orders)

    targets = [
        Target(
            "bucketq-operator", f"127.0.0.1:{op_metrics}", {"pod": "bq-bucketq-operator"}, honor_labels=True
        ),
        Target("bucketq-sidecars", f"127.0.0.1:{sc_metrics}", {"namespace": NAMESPACE, "pod": pod_name}),
    ]
    with prometheus(processes, targets) as prom:
        sel = f'namespace="{NAMESPACE}",topic="{TOPIC}",consumer="{CONSUMER}"'
        # nothing consumed yet: the sidecar waits for the app's port before it leases anything
        prom.wait_value(
            f"sum(bucketq_subscription_backlog{{{sel}}}) + sum(bucketq_subscription_in_flight{{{sel}}})",
            orders.total,
        )
        worker = processes.start(
            "worker", worker_command(app, sys.executable, str(EXAMPLES)), clean_env(**app_env)
        )
        wait_consumed(kubectl, orders, worker.log)
        check_dead_letter(
            Settings.from_dict(
                {
                    "backend": "s3",
                    "s3_endpoint_url": s3.endpoint_url,
                    "s3_bucket": bucket,
                    "s3_access_key_id": s3.access_key,
                    "s3_secret_access_key": s3.secret_key,
                }
            ),
            orders,
        )
        check_metrics(prom, orders)

    # -- RBAC: what the operator and the webhook called is what the chart grants each ------------------
    for who, spec_of in (("operator", pod_spec), ("webhook", wh_pod_spec)):
        account = spec_of["serviceAccountName"]
        calls = api_calls(emulator, "kopf/", account)
        assert calls, f"no API call of the {who} was seen"
        grants = granted(docs, account, RELEASE_NS)
        if who == "operator":
            # its leader election: the Lease in the release namespace, every granted verb used
            lease_calls = api_calls(emulator, "bucketq-operator/", account)
            assert (
                lease_calls
                == grants.pop(RELEASE_NS)
                == {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")}
            )
        assert set(grants) == {None}, f"a cluster-wide {who} has cluster-wide grants only"
        assert calls <= grants[None], (
            f"the {who} called what the chart does not grant: {sorted(calls - grants[None])}"
        )
        unused = grants[None] - calls
        assert unused <= {("", "events", "create")}, (
            f"the chart grants what the {who} never called: {sorted(unused)}"
        )

    # -- graceful shutdown, as on pod deletion -----------------------------------------------------------
    assert worker.stop() in (0, -15), f"the worker did not stop cleanly:\n{worker.log()}"
    assert sidecar_proc.stop(grace=30) == 0, f"the sidecar did not drain and exit 0:\n{sidecar_proc.log()}"
    assert operator.stop(grace=30) == 0, f"the operator did not exit 0 on SIGTERM:\n{operator.log()}"
    assert webhook_proc.stop(grace=30) == 0, f"the webhook did not exit 0 on SIGTERM:\n{webhook_proc.log()}"
