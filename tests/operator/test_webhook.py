"""The sidecar-injecting webhook: real AdmissionReview documents POSTed to kopf's webhook server."""

from __future__ import annotations

import base64
import copy
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
import yaml

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.webhook import SidecarInjector
from tests.operator.harness import Kube, RunningOperator, wait_for
from tests.operator.test_consumers import consumer
from tests.operator.test_topics import ready, topic

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod as the ReplicaSet controller sends it: no name, no namespace yet."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "worker-",
            "labels": {"app": "worker"},
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [{"name": "app", "image": "example/worker:1", "ports": [{"containerPort": 8080}]}],
            **spec,
        },
    }


def review(port: int, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
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
        f"http://127.0.0.1:{port}/inject-sidecar",
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
            delivery={"mode": "push", "push": {"port": 8080, "path": "/jobs", "concurrency": 4}},
        )
    )
    wait_for(lambda: ready(kube, "consumers", shared_ns, "billing"), "Consumer billing to be Ready")
    wait_for(lambda: shared_operator.operator.injector is not None, "the injector")
    return shared_ns


@pytest.mark.s3  # the shared operator, on the moto server
def test_pods_without_the_annotation_pass_untouched(shared_ports: dict[str, int], shared_ns: str) -> None:
    plain = pod({"other": "x"})
    response = review(shared_ports["webhook"], plain, shared_ns)
    assert response["allowed"] is True and "patch" not in response
    off = pod({"bucketq.io/inject": "false", "bucketq.io/consumer": "billing"})
    response = review(shared_ports["webhook"], off, shared_ns)
    assert response["allowed"] is True and "patch" not in response


@pytest.mark.s3  # the shared operator, on the moto server
def test_native_sidecar_injection_from_the_consumer(
    shared_ports: dict[str, int], billing: str, shared_engine: Settings
) -> None:
    original = pod(
        {"bucketq.io/inject": "true", "bucketq.io/consumer": "billing"},
        initContainers=[{"name": "migrate", "image": "example/migrate:1"}],
    )
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
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    annotations = result["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9090"
    assert annotations["bucketq.io/injected"] == "true"
    assert env_of(spec["containers"][0])["BUCKETQ_SIDECAR_URL"] == "http://127.0.0.1:3500"
    text = json.dumps(result)
    for secret in (shared_engine.s3_access_key_id, shared_engine.s3_secret_access_key):
        assert secret is not None and secret.get_secret_value() not in text, (
            "credentials must not be in the pod"
        )

    again = review(shared_ports["webhook"], copy.deepcopy(result), billing)
    assert again["allowed"] is True and "patch" not in again, "injecting twice is a no-op"


@pytest.mark.s3  # the shared operator, on the moto server
def test_regular_container_fallback_and_overrides(shared_ports: dict[str, int], billing: str) -> None:
    original = pod(
        {
            "bucketq.io/inject": "true",
            "bucketq.io/consumer": "billing",
            "bucketq.io/native-sidecar": "false",
            "bucketq.io/delivery": "pull",
            "bucketq.io/s3-secret": "team-a-s3",
            "bucketq.io/sidecar-cpu-limit": "500m",
            "bucketq.io/sidecar-memory-request": "128Mi",
            "prometheus.io/scrape": "false",
        }
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
    response = review(shared_ports["webhook"], pod({"bucketq.io/inject": "true", **annotations}), billing)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"], response["status"]["message"]


@pytest.mark.s3  # the shared operator, on the moto server
def test_warn_mode_admits_a_pod_naming_a_missing_consumer(shared_engine: Settings) -> None:
    injector = SidecarInjector(shared_engine, OperatorSettings(missing_consumer="warn"))
    body = pod({"bucketq.io/inject": "true", "bucketq.io/consumer": "ghost", "bucketq.io/topics": "orders"})
    body["metadata"]["namespace"] = "team-a"
    patch, warnings = kopf.Patch(), []  # type: ignore[var-annotated]
    injector.mutate(body=body, patch=patch, warnings=warnings, consumer_index={})
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
    own = pod({"bucketq.io/inject": "true"})
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

    conflicting = pod({"bucketq.io/inject": "true"})
    conflicting["spec"]["containers"][0]["env"] = [{"name": "BUCKETQ_ROOT", "value": "bq/team-b"}]
    response = review(shared_ports["webhook"], conflicting, billing)
    assert response["allowed"] is False
    assert "container 'app' sets BUCKETQ_ROOT to 'bq/team-b'" in response["status"]["message"]


@pytest.mark.s3  # the shared operator, on the moto server
def test_host_network_pods_need_the_allow_annotation_and_a_token(
    shared_ports: dict[str, int], billing: str
) -> None:
    refused = review(shared_ports["webhook"], pod({"bucketq.io/inject": "true"}, hostNetwork=True), billing)
    assert refused["allowed"] is False and "hostNetwork" in refused["status"]["message"]
    allowed = pod(
        {
            "bucketq.io/inject": "true",
            "bucketq.io/allow-host-network": "true",
            "bucketq.io/api-token-secret": "api-token",
        },
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
            "bucketq.io/inject": "true",
            "bucketq.io/consumer": "billing",
            "bucketq.io/api-token-secret": "billing-api-token",
            "bucketq.io/push-token-secret": "billing-push-token",
        }
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

    unsigned = pod({"bucketq.io/inject": "true", "bucketq.io/consumer": "billing"})
    response = review(shared_ports["webhook"], unsigned, billing)
    assert response["allowed"] is True
    assert any("no bucketq.io/api-token-secret" in w for w in response.get("warnings", []))
