"""The sidecar-injecting webhook: real AdmissionReview documents POSTed to kopf's webhook server."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import copy
import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
import yaml

from bucketq.config import Settings
from bucketq.operator.api_reads import ApiReadError
from bucketq.operator.config import OperatorSettings
from bucketq.operator.handlers import Operator
from bucketq.operator.webhook import SELECTORS, SidecarInjector
from tests.operator.harness import Kube, RunningOperator, wait_for
from tests.operator.test_consumers import consumer
from tests.operator.test_topics import ready, topic

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


INJECT = {"bucketq.io/inject": "true"}


def pod(
    annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod as the ReplicaSet controller sends it: no name, no namespace yet, spec defaulted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "worker-",
            "labels": {"app": "worker", **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [{"name": "app", "image": "example/worker:1", "ports": [{"containerPort": 8080}]}],
            "terminationGracePeriodSeconds": 30,  # what the apiserver sets before admission
            **spec,
        },
    }


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """kopf's label filter as the objectSelector it becomes (PRESENT: Exists, ABSENT: DoesNotExist)."""
    for key, value in selector.items():
        if value is kopf.PRESENT:
            ok = key in labels
        elif value is kopf.ABSENT:
            ok = key not in labels
        else:
            ok = labels.get(key) == value
        if not ok:
            return False
    return True


def webhook_path(obj: dict[str, Any]) -> str | None:
    """The path the apiserver would call for ``obj``: the webhook whose objectSelector matches, or None."""
    labels = obj["metadata"].get("labels") or {}
    found = [f"/{handler}" for handler, selector in SELECTORS.items() if _matches(selector, labels)]
    assert len(found) <= 1, f"the objectSelectors overlap for {labels}: {found}"
    return found[0] if found else None


def review(port: int, obj: dict[str, Any], namespace: str, path: str | None = None) -> dict[str, Any]:
    """POST the AdmissionReview the apiserver would send (to ``path``, default: the matching webhook)."""
    path = path or webhook_path(obj)
    assert path is not None, "no webhook's objectSelector matches this pod: the apiserver would not call"
    document = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(document).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.loads(resp.read())
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == document["request"]["uid"]
    return dict(answer["response"])


def admitted(response: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """The pod after the response's JSON patch (RFC 6902) is applied."""
    assert response["allowed"] is True, response
    if "patch" not in response:
        return obj
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return dict(jsonpatch.apply_patch(obj, ops))


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.fixture
def billing(kube: Kube, shared_ns: str, shared_operator: RunningOperator) -> str:
    """A namespace with Topic orders and a push Consumer billing."""
    kube.create(topic(shared_ns, "orders", partitions=2))
    kube.create(
        consumer(
            shared_ns,
            "billing",
            topics=["orders"],
            maxInFlight=50,
            ordered=True,
            delivery={
                "mode": "push",
                "push": {
                    "port": 8080,
                    "path": "/jobs",
                    "concurrency": 4,
                    "batchSize": 10,
                    "retry": {"initialSeconds": 0.5, "maxSeconds": 120},
                },
            },
        )
    )
    wait_for(lambda: ready(kube, "consumers", shared_ns, "billing"), "Consumer billing to be Ready")
    wait_for(lambda: shared_operator.operator.injector is not None, "the injector")
    return shared_ns


@pytest.mark.s3  # the shared operator, on the moto server
def test_pods_without_the_labels_pass_untouched(shared_ports: dict[str, int], shared_ns: str) -> None:
    annotated = pod({"bucketq.io/inject": "true", "bucketq.io/consumer": "billing"})
    assert webhook_path(annotated) is None, "annotations alone never send a pod to the webhook"
    for path in [f"/{handler}" for handler in SELECTORS]:
        # even if one came (a hand-made configuration), kopf's label filters leave it alone
        response = review(shared_ports["webhook"], annotated, shared_ns, path)
        assert response["allowed"] is True and "patch" not in response
    off = pod({"bucketq.io/inject": "false"}, {"bucketq.io/consumer": "billing"})
    response = review(shared_ports["webhook"], off, shared_ns)
    assert response["allowed"] is True and "patch" not in response


@pytest.mark.s3  # the shared operator, on the moto server
def test_native_sidecar_injection_from_the_consumer_label_alone(
    shared_ports: dict[str, int], billing: str, shared_engine: Settings
) -> None:
    original = pod(
        labels={"bucketq.io/consumer": "billing"},
        initContainers=[{"name": "migrate", "image": "example/migrate:1"}],
    )
    assert webhook_path(original) == "/inject-consumer"
    response = review(shared_ports["webhook"], copy.deepcopy(original), billing)
    result = admitted(response, copy.deepcopy(original))
    spec = result["spec"]
    sidecar = spec["initContainers"][0]
    assert sidecar["name"] == "bucketq-sidecar" and sidecar["restartPolicy"] == "Always"
    assert spec["initContainers"][1]["name"] == "migrate", (
        "the native sidecar starts before other init containers"
    )
    assert sidecar["image"] == "bucketq:test" and sidecar["command"] == ["bucketq", "sidecar"]
    env = env_of(sidecar)
    assert env["BUCKETQ_SIDECAR_CONSUMER"] == "billing"
    assert env["BUCKETQ_SIDECAR_TOPICS"] == "orders"
    assert env["BUCKETQ_SIDECAR_DELIVERY"] == "push"
    assert env["BUCKETQ_SIDECAR_APP_PORT"] == "8080" and env["BUCKETQ_SIDECAR_APP_PATH"] == "/jobs"
    assert env["BUCKETQ_SIDECAR_PUSH_CONCURRENCY"] == "4" and env["BUCKETQ_SIDECAR_MAX_IN_FLIGHT"] == "50"
    assert env["BUCKETQ_SIDECAR_PUSH_BATCH_SIZE"] == "10"
    assert (
        env["BUCKETQ_SIDECAR_PUSH_RETRY_INITIAL_S"],
        env["BUCKETQ_SIDECAR_PUSH_RETRY_MAX_S"],
        env["BUCKETQ_SIDECAR_PUSH_RETRY_MULTIPLIER"],
    ) == ("0.5", "120", "2"), "the Consumer's retry, its unset multiplier defaulted by the schema"
    assert env["BUCKETQ_SIDECAR_SHUTDOWN_BUDGET_S"] == "25", "30 s of grace less 5"
    assert env["BUCKETQ_CONSUMER__ORDERED"] == "true"
    assert env["BUCKETQ_ROOT"] == "bq/$(BUCKETQ_POD_NAMESPACE)"
    assert env["BUCKETQ_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["BUCKETQ_S3_BUCKET"] == shared_engine.s3_bucket
    assert env["BUCKETQ_S3_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "bucketq-sidecar-s3", "key": "accessKeyId"}
    }
    assert env["BUCKETQ_S3_SECRET_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "bucketq-sidecar-s3", "key": "secretAccessKey"}
    }
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9580}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9580}
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    annotations = result["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9580"
    assert annotations["bucketq.io/injected"] == "true"
    assert result["metadata"]["labels"] == {
        "app": "worker",
        "bucketq.io/consumer": "billing",
        "bucketq.io/injected": "true",
    }
    assert env_of(spec["containers"][0])["BUCKETQ_SIDECAR_URL"] == "http://127.0.0.1:3580"
    assert spec["terminationGracePeriodSeconds"] == 30, "left as it was without the annotation"
    text = json.dumps(result)
    for secret in (shared_engine.s3_access_key_id, shared_engine.s3_secret_access_key):
        assert secret is not None and secret.get_secret_value() not in text, (
            "credentials must not be in the pod"
        )

    again = review(shared_ports["webhook"], copy.deepcopy(result), billing)
    assert again["allowed"] is True and "patch" not in again, "injecting twice is a no-op"


@pytest.mark.s3  # the shared operator, on the moto server
def test_per_pod_ports_and_shutdown_annotations(shared_ports: dict[str, int], billing: str) -> None:
    original = pod(
        {
            "bucketq.io/api-port": "4580",
            "bucketq.io/metrics-port": "9581",
            "bucketq.io/drain-grace-seconds": "20",
            "bucketq.io/termination-grace-seconds": "90",
        },
        {"bucketq.io/consumer": "billing"},
    )
    response = review(shared_ports["webhook"], copy.deepcopy(original), billing)
    result = admitted(response, copy.deepcopy(original))
    sidecar = result["spec"]["initContainers"][0]
    env = env_of(sidecar)
    assert env["BUCKETQ_SIDECAR_LISTEN_PORT"] == "4580" and env["BUCKETQ_SIDECAR_METRICS_PORT"] == "9581"
    assert sidecar["startupProbe"]["httpGet"]["port"] == 9581
    assert result["metadata"]["annotations"]["prometheus.io/port"] == "9581"
    assert env_of(result["spec"]["containers"][0])["BUCKETQ_SIDECAR_URL"] == "http://127.0.0.1:4580"
    assert result["spec"]["terminationGracePeriodSeconds"] == 90
    assert env["BUCKETQ_SIDECAR_SHUTDOWN_BUDGET_S"] == "85" and env["BUCKETQ_SIDECAR_DRAIN_GRACE_S"] == "20"
    again = review(shared_ports["webhook"], copy.deepcopy(result), billing)
    assert again["allowed"] is True and "patch" not in again, "the webhook's own work seen again"


@pytest.mark.s3  # the shared operator, on the moto server
def test_a_consumer_created_just_after_its_pod_is_waited_for(
    shared_ports: dict[str, int], kube: Kube, shared_ns: str
) -> None:
    """kubectl apply of a Consumer and its Deployment together: the first pod may come first."""
    kube.create(topic(shared_ns, "jobs"))
    original = pod(labels={"bucketq.io/consumer": "late"})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(review, shared_ports["webhook"], copy.deepcopy(original), shared_ns)
        time.sleep(0.3)
        assert not pending.done(), "the webhook answered before the Consumer existed"
        kube.create(consumer(shared_ns, "late", topics=["jobs"]))
        response = pending.result(timeout=10)
    sidecar = admitted(response, copy.deepcopy(original))["spec"]["initContainers"][0]
    assert env_of(sidecar)["BUCKETQ_SIDECAR_TOPICS"] == "jobs"


@pytest.mark.s3  # the shared operator, on the moto server
def test_regular_container_fallback_and_overrides(shared_ports: dict[str, int], billing: str) -> None:
    original = pod(
        {
            "bucketq.io/consumer": "billing",
            "bucketq.io/native-sidecar": "false",
            "bucketq.io/delivery": "pull",
            "bucketq.io/s3-secret": "team-a-s3",
            "bucketq.io/sidecar-cpu-limit": "500m",
            "bucketq.io/sidecar-memory-request": "128Mi",
            "prometheus.io/scrape": "false",
        },
        INJECT,
    )
    result = admitted(
        review(shared_ports["webhook"], copy.deepcopy(original), billing), copy.deepcopy(original)
    )
    assert "initContainers" not in result["spec"]
    app, sidecar = result["spec"]["containers"]
    assert app["name"] == "app" and sidecar["name"] == "bucketq-sidecar" and "restartPolicy" not in sidecar
    assert sidecar["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    env = env_of(sidecar)
    assert env["BUCKETQ_SIDECAR_DELIVERY"] == "pull"
    assert env["BUCKETQ_S3_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == "team-a-s3"
    assert result["metadata"]["annotations"]["prometheus.io/scrape"] == "false", (
        "the app's own setting is kept"
    )


@pytest.mark.s3  # the shared operator, on the moto server
@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"bucketq.io/consumer": "nobody"}, "Consumer 'nobody' does not exist in namespace"),
        ({"bucketq.io/consumer": "billing", "bucketq.io/app-port": "http"}, "is not a port number"),
        ({"bucketq.io/consumer": "billing", "bucketq.io/topics": "orders,refunds"}, "refunds"),
        (
            {"bucketq.io/consumer": "billing", "bucketq.io/sidecar-cpu-limit": "lots"},
            "not a Kubernetes quantity",
        ),
        ({"bucketq.io/delivery": "push"}, "push delivery needs bucketq.io/consumer"),
    ],
)
def test_bad_pods_are_rejected_with_a_clear_message(
    shared_ports: dict[str, int], billing: str, annotations: dict[str, str], message: str
) -> None:
    response = review(shared_ports["webhook"], pod(annotations, INJECT), billing)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"], response["status"]["message"]


BAD_POD_ANNOTATIONS: list[tuple[dict[str, str], str]] = [
    (
        {"bucketq.io/consumer": "billing", "bucketq.io/api-port": "x"},
        "api-port: 'x' is not a port number",
    ),
    (
        {"bucketq.io/metrics-port": "8080"},
        "container 'app' declares port 8080, the sidecar's metrics port",
    ),
    ({"bucketq.io/termination-grace-seconds": "-3"}, "'-3' is not a number of seconds"),
    ({"bucketq.io/drain-grace-seconds": "long"}, "drain-grace-seconds: 'long' is not a number"),
    ({"bucketq.io/inject": "perhaps"}, "annotation bucketq.io/inject: 'perhaps' is not true or false"),
]


@pytest.mark.s3  # the shared operator, on the moto server
def test_bad_port_and_shutdown_annotations_are_admission_errors(
    shared_ports: dict[str, int], billing: str
) -> None:
    for given, message in BAD_POD_ANNOTATIONS:
        for labels in (INJECT, {"bucketq.io/consumer": "billing"}):
            response = review(shared_ports["webhook"], pod(given, labels), billing)
            assert response["allowed"] is False and response["status"]["code"] == 400, given
            assert message in response["status"]["message"], response["status"]["message"]


@pytest.mark.s3  # the shared operator, on the moto server
def test_warn_mode_admits_a_pod_naming_a_missing_consumer(shared_engine: Settings) -> None:
    settings = OperatorSettings(missing_consumer="warn", webhook_consumer_wait_s=0.2)
    injector = SidecarInjector(shared_engine, settings)
    body = pod({"bucketq.io/topics": "orders"}, {"bucketq.io/consumer": "ghost"})
    body["metadata"]["namespace"] = "team-a"
    patch, warnings = kopf.Patch(), []  # type: ignore[var-annotated]
    started = time.monotonic()
    asyncio.run(injector.mutate(body=body, patch=patch, warnings=warnings, consumer_index={}))
    assert time.monotonic() - started >= 0.2, "the webhook waited for the Consumer to arrive"
    assert warnings and "Consumer 'ghost' does not exist in namespace 'team-a'" in warnings[0]
    sidecar = patch["spec"]["initContainers"][0]
    assert env_of(sidecar)["BUCKETQ_SIDECAR_CONSUMER"] == "ghost"
    assert env_of(sidecar)["BUCKETQ_SIDECAR_TOPICS"] == "orders"


@pytest.mark.s3  # the shared operator, on the moto server
def test_the_example_deployment_gets_its_sidecar(
    shared_ports: dict[str, int], kube: Kube, shared_ns: str
) -> None:
    for path in ("topic.yaml", "deadletterpolicy.yaml", "consumer.yaml"):
        for doc in yaml.safe_load_all((EXAMPLES / path).read_text()):
            doc["metadata"]["namespace"] = shared_ns
            kube.create(doc)
    wait_for(lambda: ready(kube, "consumers", shared_ns, "billing"), "the example Consumer to be Ready")
    deployment = yaml.safe_load((EXAMPLES / "worker-deployment.yaml").read_text())
    template = deployment["spec"]["template"]
    original = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}
    result = admitted(
        review(shared_ports["webhook"], copy.deepcopy(original), shared_ns), copy.deepcopy(original)
    )
    sidecar = result["spec"]["initContainers"][0]
    assert sidecar["name"] == "bucketq-sidecar"
    assert env_of(sidecar)["BUCKETQ_SIDECAR_CONSUMER"] == "billing"


def test_tls_webhook_server_with_a_generated_certificate() -> None:
    """Production mode: HTTPS with a self-signed certificate made by the operator (no oscrypto)."""
    import asyncio
    import ssl

    from bucketq.operator.webhook import webhook_server
    from tests.support.servers import free_ports

    (port,) = free_ports(1)
    server = webhook_server(
        OperatorSettings(
            webhook_addr="127.0.0.1", webhook_port=port, webhook_host="bucketq-operator.bucketq.svc"
        )
    )

    async def answer(request: dict[str, Any], **_: Any) -> dict[str, Any]:
        return {"seen": request["request"]["namespace"]}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with server:
            configs = server(answer)
            client_config = await configs.__anext__()
            context = ssl.create_default_context(cadata=base64.b64decode(client_config["caBundle"]).decode())
            context.check_hostname = False  # the certificate names the Service, we dial 127.0.0.1
            body = json.dumps({"request": {"namespace": "team-a", "object": {"metadata": {}}}}).encode()
            req = urllib.request.Request(
                f"https://127.0.0.1:{port}/inject-sidecar",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            reply = await asyncio.to_thread(
                lambda: json.loads(urllib.request.urlopen(req, context=context).read())
            )
            await configs.aclose()
            return dict(client_config), reply

    client_config, reply = asyncio.run(main())
    assert client_config["url"] == f"https://bucketq-operator.bucketq.svc:{port}"
    assert reply == {"seen": "team-a"}


# -- hardening: the webhook owns the sidecar, tokens, hostNetwork (docs/security.md) -------------


@pytest.mark.s3  # the shared operator, on the moto server
def test_a_pod_with_its_own_sidecar_naming_another_namespace_is_rejected(
    shared_ports: dict[str, int], billing: str
) -> None:
    own = pod(labels=INJECT)
    own["spec"]["containers"].append(
        {
            "name": "bucketq-sidecar",
            "image": "bucketq:test",
            "command": ["bucketq", "sidecar"],
            "env": [{"name": "BUCKETQ_ROOT", "value": "bq/team-b"}],
        }
    )
    response = review(shared_ports["webhook"], own, billing)
    assert response["allowed"] is False and response["status"]["code"] == 400
    message = response["status"]["message"]
    assert "declares its own 'bucketq-sidecar'" in message and "the bucketq webhook injects it" in message

    conflicting = pod(labels=INJECT)
    conflicting["spec"]["containers"][0]["env"] = [{"name": "BUCKETQ_ROOT", "value": "bq/team-b"}]
    response = review(shared_ports["webhook"], conflicting, billing)
    assert response["allowed"] is False
    assert "container 'app' sets BUCKETQ_ROOT to 'bq/team-b'" in response["status"]["message"]


@pytest.mark.s3  # the shared operator, on the moto server
def test_host_network_pods_need_the_allow_annotation_and_a_token(
    shared_ports: dict[str, int], billing: str
) -> None:
    refused = review(shared_ports["webhook"], pod(labels=INJECT, hostNetwork=True), billing)
    assert refused["allowed"] is False and "hostNetwork" in refused["status"]["message"]
    allowed = pod(
        {"bucketq.io/allow-host-network": "true", "bucketq.io/token-secret": "api-token"},
        INJECT,
        hostNetwork=True,
    )
    response = review(shared_ports["webhook"], copy.deepcopy(allowed), billing)
    result = admitted(response, copy.deepcopy(allowed))
    assert result["spec"]["initContainers"][0]["name"] == "bucketq-sidecar"
    assert any("hostNetwork pod" in w for w in response.get("warnings", []))


@pytest.mark.s3  # the shared operator, on the moto server
def test_token_secrets_are_wired_into_sidecar_and_app(shared_ports: dict[str, int], billing: str) -> None:
    original = pod(
        {
            "bucketq.io/api-token-secret": "billing-api-token",
            "bucketq.io/push-token-secret": "billing-push-token",
        },
        {"bucketq.io/consumer": "billing"},
    )
    response = review(shared_ports["webhook"], copy.deepcopy(original), billing)
    result = admitted(response, copy.deepcopy(original))
    sidecar, app = result["spec"]["initContainers"][0], result["spec"]["containers"][0]
    api = {"secretKeyRef": {"name": "billing-api-token", "key": "token"}}
    push = {"secretKeyRef": {"name": "billing-push-token", "key": "token"}}
    assert env_of(app)["BUCKETQ_API_TOKEN"] == api and env_of(app)["BUCKETQ_PUSH_TOKEN"] == push
    assert env_of(sidecar)["BUCKETQ_SIDECAR_APP_TOKEN"] == push
    token_file = env_of(sidecar)["BUCKETQ_SIDECAR_TOKEN_FILE"]
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "bucketq-api-token")
    assert token_file == mount["mountPath"] + "/token" and mount["readOnly"] is True
    volume = next(v for v in result["spec"]["volumes"] if v["name"] == "bucketq-api-token")
    assert volume["secret"]["secretName"] == "billing-api-token"
    assert not any("api-token-secret" in w for w in response.get("warnings", []))
    again = review(shared_ports["webhook"], copy.deepcopy(result), billing)
    assert again["allowed"] is True and "patch" not in again, "the webhook's own sidecar passes unchanged"

    unsigned = pod(labels={"bucketq.io/consumer": "billing"})
    response = review(shared_ports["webhook"], unsigned, billing)
    assert response["allowed"] is True
    assert any("no bucketq.io/token-secret" in w for w in response.get("warnings", []))


# -- availability: webhook-only replicas, one certificate, the managed configuration ----------------


def webhook_only_settings(namespaces: str, port: int, *, consumer_wait_s: float) -> OperatorSettings:
    """A webhook-only replica (as the chart runs them) for the namespaces matching the pattern,
    serving plain HTTP on 127.0.0.1:``port``."""
    from tests.operator.harness import fast_settings

    return fast_settings(
        [namespaces],
        webhook=True,
        webhook_only=True,
        webhook_insecure=True,
        webhook_managed=False,
        webhook_addr="127.0.0.1",
        webhook_port=port,
        webhook_consumer_wait_s=consumer_wait_s,
        sidecar_image="bucketq:test",
    )


@pytest.fixture
def webhook_replicas(emulator: Any, shared_engine: Settings) -> Any:
    """Two operators in webhook-only mode for the namespaces ``whonly-*`` (as the chart runs them)."""
    from tests.operator.harness import port_open, start_operator
    from tests.support.servers import free_ports

    ports = free_ports(2)
    replicas = []
    try:
        for port in ports:
            settings = webhook_only_settings("whonly-*", port, consumer_wait_s=5.0)
            replicas.append(start_operator(emulator.url, shared_engine, settings))
            wait_for(lambda p=port: port_open(p), "a webhook replica to listen")
        yield ports
    finally:
        for running in replicas:
            running.stop()


@pytest.mark.s3  # the engine settings of the moto server (the webhook itself never calls S3)
def test_every_webhook_only_replica_serves_and_none_reconciles(
    webhook_replicas: list[int], kube: Kube
) -> None:
    namespace = kube.namespace("whonly")
    owned = consumer(
        namespace, "billing", topics=["orders"], delivery={"mode": "push", "push": {"port": 8080}}
    )
    owned["metadata"]["finalizers"] = ["bucketq.io/finalizer"]  # as the operator would have set it
    created_version = kube.create(owned)["metadata"]["resourceVersion"]
    original = pod(labels={"bucketq.io/consumer": "billing"})
    for port in webhook_replicas:
        # each replica learns of Consumers from its watch; under load that can lag the replica's
        # own wait for an unseen Consumer: ask until it has seen this one (then it must admit)
        response = wait_for(
            lambda port=port: (r := review(port, copy.deepcopy(original), namespace))["allowed"] and r,
            f"webhook replica on port {port} to know Consumer billing",
            timeout=30,
        )
        sidecar = admitted(response, copy.deepcopy(original))["spec"]["initContainers"][0]
        env = env_of(sidecar)
        assert env["BUCKETQ_SIDECAR_DELIVERY"] == "push" and env["BUCKETQ_SIDECAR_APP_PORT"] == "8080"
    refused = review(webhook_replicas[1], pod(labels={"bucketq.io/consumer": "nobody"}), namespace)
    assert refused["allowed"] is False and "Consumer 'nobody' does not exist" in refused["status"]["message"]
    time.sleep(1.5)  # several status intervals of an operator that would reconcile
    obj = kube.get("consumers", namespace, "billing")
    assert obj is not None and "status" not in obj, "a webhook replica wrote a status"
    assert obj["metadata"].get("finalizers") == ["bucketq.io/finalizer"], (
        "a webhook replica touched the operator's finalizer (deleting the Consumer would skip its clean-up)"
    )
    assert not [a for a in obj["metadata"].get("annotations") or {} if a.startswith("bucketq.io/")]
    assert obj["metadata"]["resourceVersion"] == created_version, "a webhook replica wrote the Consumer"
    kube.patch("consumers", namespace, "billing", {"metadata": {"finalizers": None}})


class _LaggingWatch(Operator):
    """An operator whose watch never delivers Consumers named ``unseen*``: a lagging watch (a
    namespace a replica has only just started to watch, a busy API server) made permanent."""

    def index_spec(self, namespace: str, name: str, spec: Any, **kwargs: Any) -> dict[Any, Any]:
        return {} if name.startswith("unseen") else super().index_spec(namespace, name, spec, **kwargs)


@pytest.mark.s3  # the engine settings of the moto server (the webhook itself never calls S3)
def test_a_consumer_the_watch_has_not_delivered_is_read_from_the_api_server(
    emulator: Any, shared_engine: Settings, kube: Kube
) -> None:
    from tests.operator.harness import port_open
    from tests.support.servers import free_ports

    [port] = free_ports(1)
    settings = webhook_only_settings("lagging-*", port, consumer_wait_s=0.5)
    running = RunningOperator(_LaggingWatch(shared_engine, settings), emulator.url).start()
    try:
        wait_for(lambda: port_open(port), "the webhook to listen")
        namespace = kube.namespace("lagging")
        kube.create(consumer(namespace, "unseen", topics=["orders", "audit"]))
        original = pod(labels={"bucketq.io/consumer": "unseen"})
        response = review(port, copy.deepcopy(original), namespace)
        sidecar = admitted(response, copy.deepcopy(original))["spec"]["initContainers"][0]
        assert env_of(sidecar)["BUCKETQ_SIDECAR_TOPICS"] == "orders,audit"
        # the API server has no such Consumer either: refused, as before
        refused = review(port, pod(labels={"bucketq.io/consumer": "unseen-nobody"}), namespace)
        assert refused["allowed"] is False, refused
        assert "Consumer 'unseen-nobody' does not exist" in refused["status"]["message"]
    finally:
        running.stop()


def test_when_the_api_server_cannot_be_asked_the_index_decides(shared_engine: Settings) -> None:
    """A failed read (a role without ``get``, an API server that does not answer) admits nothing on
    a guess: the pod is refused as when the Consumer does not exist."""
    asked: list[tuple[str, str]] = []

    async def failing_read(namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((namespace, name))
        raise ApiReadError("GET ...: 403 Forbidden")

    settings = OperatorSettings(webhook_consumer_wait_s=0.1)
    injector = SidecarInjector(shared_engine, settings, read=failing_read)
    body = pod(labels={"bucketq.io/consumer": "billing"})
    body["metadata"]["namespace"] = "team-a"
    with pytest.raises(kopf.AdmissionError, match="Consumer 'billing' does not exist in namespace 'team-a'"):
        asyncio.run(injector.mutate(body=body, patch=kopf.Patch(), warnings=[], consumer_index={}))
    assert asked == [("team-a", "billing")]
    # a Consumer the index has is never read again
    asyncio.run(
        injector.mutate(
            body=body,
            patch=kopf.Patch(),
            warnings=[],
            consumer_index={("team-a", "billing"): [{"topics": ["orders"]}]},
        )
    )
    assert asked == [("team-a", "billing")]


def test_webhook_only_mode_settings_are_checked() -> None:
    from pydantic import ValidationError

    ok = OperatorSettings(
        webhook_only=True, webhook_managed=False, webhook_cert_file="/c", webhook_key_file="/k"
    )
    assert ok.webhook_only
    for overrides, message in [
        ({"webhook_managed": False}, "every replica must serve the same certificate"),
        ({"webhook_insecure": True}, "needs webhook_managed=false"),
        ({"webhook_insecure": True, "webhook_managed": False, "webhook": False}, "needs webhook=true"),
        (
            {"webhook_insecure": True, "webhook_managed": False, "peering": "bucketq"},
            "runs without peering",
        ),
    ]:
        with pytest.raises(ValidationError, match=message):
            OperatorSettings(webhook_only=True, **overrides)


def test_replicas_serving_one_mounted_certificate_are_all_trusted(tmp_path: Path) -> None:
    """The chart mounts one Secret into every replica: one caBundle verifies them all."""
    import ssl

    from bucketq.operator.certs import self_signed
    from bucketq.operator.webhook import webhook_server
    from tests.support.servers import free_ports

    cert, key = self_signed(["bq-bucketq-webhook.bucketq.svc"], tmp_path)
    ports = free_ports(2)
    servers = [
        webhook_server(
            OperatorSettings(
                webhook_only=True,
                webhook_managed=False,
                webhook_addr="127.0.0.1",
                webhook_port=port,
                webhook_host="bq-bucketq-webhook.bucketq.svc",
                webhook_cert_file=str(cert),
                webhook_key_file=str(key),
            )
        )
        for port in ports
    ]

    async def answer(request: dict[str, Any], **_: Any) -> dict[str, Any]:
        return {"seen": request["request"]["namespace"]}

    async def call(port: int, context: ssl.SSLContext) -> dict[str, Any]:
        body = json.dumps({"request": {"namespace": "team-a", "object": {"metadata": {}}}}).encode()
        req = urllib.request.Request(
            f"https://127.0.0.1:{port}/inject-consumer",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        return dict(
            await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(req, context=context).read()))
        )

    async def main() -> list[dict[str, Any]]:
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False  # the certificate names the Service, we dial 127.0.0.1
        replies = []
        async with servers[0], servers[1]:
            configs = [server(answer) for server in servers]
            bundles = {(await c.__anext__())["caBundle"] for c in configs}
            assert len(bundles) == 1, "the replicas would need different caBundles"
            for port in ports:
                replies.append(await call(port, context))
            for c in configs:
                await c.aclose()
        return replies

    assert asyncio.run(main()) == [{"seen": "team-a"}, {"seen": "team-a"}]


@pytest.mark.s3  # the operator reconciles against the moto server
def test_the_managed_configuration_fails_closed_for_labelled_pods_only(
    emulator: Any, kube: Kube, shared_engine: Settings
) -> None:
    """Without the chart, kopf writes the configuration: the same failurePolicy and selectors."""
    from tests.operator.harness import fast_settings, start_operator
    from tests.support.servers import free_ports

    (port,) = free_ports(1)
    settings = fast_settings(
        ["managed-*"],
        webhook=True,
        webhook_insecure=True,
        webhook_managed=True,
        webhook_addr="127.0.0.1",
        webhook_port=port,
    )
    running = start_operator(emulator.url, shared_engine, settings)
    try:
        config = wait_for(
            lambda: (
                (c := kube.get("mutatingwebhookconfigurations", None, "bucketq.io"))
                and c.get("webhooks")
                and c
            ),
            "kopf to write its MutatingWebhookConfiguration",
        )
    finally:
        running.stop()
    webhooks = {w["name"]: w for w in config["webhooks"]}
    assert set(webhooks) == {"inject-consumer.bucketq.io", "inject-sidecar.bucketq.io"}
    assert {w["failurePolicy"] for w in webhooks.values()} == {"Fail"}
    assert webhooks["inject-consumer.bucketq.io"]["objectSelector"] == {
        "matchExpressions": [{"key": "bucketq.io/consumer", "operator": "Exists"}]
    }
    assert webhooks["inject-sidecar.bucketq.io"]["objectSelector"] == {
        "matchExpressions": [
            {"key": "bucketq.io/inject", "operator": "In", "values": ["true"]},
            {"key": "bucketq.io/consumer", "operator": "DoesNotExist"},
        ]
    }
    assert webhooks["inject-consumer.bucketq.io"]["clientConfig"]["url"].endswith(f":{port}/inject-consumer")
    left = kube.get("mutatingwebhookconfigurations", None, "bucketq.io")
    assert left is not None and len(left["webhooks"]) == 2, (
        "the webhooks stay while the operator is down: labelled pods wait instead of starting bare"
    )
    kube.delete("mutatingwebhookconfigurations", None, "bucketq.io")


def test_the_webhook_only_command_explains_a_missing_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bucketq.cli.app import app

    monkeypatch.setenv("BUCKETQ_BACKEND", "s3")
    monkeypatch.setenv("BUCKETQ_S3_BUCKET", "queues")
    monkeypatch.setenv("BUCKETQ_OPERATOR_WEBHOOK_MANAGED", "false")
    for name in ("BUCKETQ_OPERATOR_WEBHOOK_CERT_FILE", "BUCKETQ_OPERATOR_WEBHOOK_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    done = CliRunner().invoke(app, ["operator", "--webhook-only"])
    assert done.exit_code == 2
    assert "webhook_only needs webhook_cert_file and webhook_key_file" in done.output
