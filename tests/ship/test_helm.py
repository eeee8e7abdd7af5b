"""The Helm chart, with the real helm binary: lint, render, validate, and check what it wires together.

Rendered built-in objects are validated offline with ``kubernetes-validate --strict`` for the oldest
and the newest Kubernetes version the chart supports; the operator's RBAC is compared with what the
operator's kopf registry will call; the webhook's TLS chain is checked with real X.509 verification.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ship.chart_tools import (
    CHART,
    NAMESPACE,
    NEWEST_KUBE,
    OLDEST_KUBE,
    RELEASE,
    REPO,
    Doc,
    component,
    container_env,
    custom_resource_problems,
    find,
    granted,
    helm,
    kubernetes_validator,
    load_crds,
    one,
    operator_container,
    operator_permissions,
    operator_settings_from_env,
    render,
    rules_permissions,
    secret_data,
    selector_matches,
    template,
    validate_kubernetes,
    webhook_container,
)
from tests.support import tools

# helm (and kubernetes-validate) run as real processes: a quarter of `make test-fast`'s CPU when it
# ran them, so they run in `make test` only (e2e: real processes)
pytestmark = pytest.mark.e2e

FULLNAME = f"{RELEASE}-bucketq"
# what the downward API gives an operator replica (its Lease identity and namespace)
POD_FIELDS = {"metadata.name": f"{FULLNAME}-6d9f8-abcde", "metadata.namespace": NAMESPACE}
MONITORING_APIS = [
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
]
ALL_APIS = [*MONITORING_APIS, "cert-manager.io/v1", "keda.sh/v1alpha1", "keda.sh/v1alpha1/ScaledObject"]
DIGEST = "sha256:" + "ab" * 32

# Every option moved away from its default, with every optional integration on.
FULL: dict[str, Any] = {
    "image": {"repository": "registry.example.com/team/bucketq", "digest": DIGEST, "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "s3": {
        "bucket": "queues",
        "endpointUrl": "http://minio.storage:9000",
        "root": "prod",
        "strategy": "conditional_write",
        "existingSecret": "minio-creds",
        "accessKeyIdKey": "user",
        "secretAccessKeyKey": "password",
        "region": "eu-west-1",
    },
    "operator": {
        "namespaces": ["shop", "billing"],
        "logLevel": "DEBUG",
        "statusIntervalSeconds": 10,
        "missingConsumer": "warn",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "queues", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "extraEnv": [{"name": "BUCKETQ_OPERATOR_DEDUP_WINDOW_S", "value": "600"}],
    },
    "serviceAccount": {
        "name": "bq-operator",
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/bq"},
    },
    "webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 5, "port": 8443},
    "certManager": {"enabled": True},
    "sidecar": {
        "native": False,
        "s3EndpointUrl": "http://minio.storage.svc:9000",
        "apiPort": 4500,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
    },
    "metrics": {"serviceMonitor": {"labels": {"release": "kube-prometheus"}, "interval": "15s"}},
    "networkPolicy": {
        "enabled": True,
        "apiServer": {"from": [{"ipBlock": {"cidr": "172.20.0.0/24"}}]},
        "metrics": {
            "namespaceSelector": {"matchLabels": {"team": "observability"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        },
    },
    "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
    "keda": {
        "scaledObjects": [
            {
                "name": "billing-worker",
                "namespace": "billing",
                "consumer": "billing",
                "scaleTargetRef": {"name": "billing-worker"},
                "maxReplicaCount": 20,
                "backlogPerReplica": 50,
            }
        ]
    },
}
NO_WEBHOOK: dict[str, Any] = {"webhook": {"enabled": False}, "s3": {"existingSecret": ""}}
SCENARIOS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "defaults": ({}, []),
    "defaults-with-prometheus-operator": ({}, MONITORING_APIS),
    "everything-changed": (FULL, ALL_APIS),
    "no-webhook-pod-identity": (NO_WEBHOOK, []),
}
BUILTIN_APIS = {
    "v1",
    "apps/v1",
    "rbac.authorization.k8s.io/v1",
    "admissionregistration.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "networking.k8s.io/v1",
    "policy/v1",
}
CUSTOM_APIS = {"monitoring.coreos.com/v1", "cert-manager.io/v1", "keda.sh/v1alpha1"}


@pytest.fixture(scope="module")
def defaults() -> list[Doc]:
    return render()


@pytest.fixture(scope="module")
def full() -> list[Doc]:
    return render(FULL, api_versions=ALL_APIS)


# -- lint, render, validate ---------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_strict(scenario: str, tmp_path: Path) -> None:
    values, _ = SCENARIOS[scenario]
    # helm lint takes no --api-versions: leave out what needs cert-manager or KEDA
    values = {k: v for k, v in values.items() if k not in ("certManager", "keda")}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", str(path))
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_builtin_object_is_valid_kubernetes(scenario: str, kube_version: str, tmp_path: Path) -> None:
    values, apis = SCENARIOS[scenario]
    docs = render(values, kube_version=kube_version, api_versions=apis, include_crds=True)
    builtin = [d for d in docs if d["apiVersion"] in BUILTIN_APIS]
    others = {d["apiVersion"] for d in docs} - BUILTIN_APIS
    assert others <= CUSTOM_APIS, f"objects of unexpected APIs: {others}"
    result = validate_kubernetes(builtin, kube_version, tmp_path / "rendered.yaml")
    passed = re.findall(r"passed for resource (\S+)", result.stdout + result.stderr)
    assert result.returncode == 0, (
        f"kubernetes-validate --strict -k {kube_version}:\n{result.stdout}{result.stderr}"
    )
    assert len(passed) == len(builtin), f"validated {len(passed)} of {len(builtin)} objects:\n{result.stdout}"


def test_kubernetes_versions_below_the_supported_range_are_refused() -> None:
    result = template(kube_version="1.28.9", check=False)
    assert result.returncode != 0 and "kubeVersion" in result.stderr + result.stdout


def test_kubernetes_validate_knows_the_versions_we_claim() -> None:
    kubernetes_validator()
    from kubernetes_validate.utils import all_versions  # type: ignore[import-untyped, unused-ignore]

    known = {v.rsplit(".", 1)[0] if v.count(".") == 2 else v for v in all_versions()}
    for version in (OLDEST_KUBE, NEWEST_KUBE):
        assert version.rsplit(".", 1)[0] in known, f"kubernetes-validate has no schemas for {version}"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={OLDEST_KUBE}-0"


def test_crds_rendered_by_the_chart_are_the_generated_ones() -> None:
    from bucketq.operator.crds import rendered_files

    generated = rendered_files()
    chart_files = {p.name: p.read_text() for p in sorted((CHART / "crds").glob("*.yaml"))}
    top_files = {p.name: p.read_text() for p in sorted((REPO / "crds").glob("*.yaml"))}
    assert chart_files == generated, "helm/bucketq/crds/ differs from `bucketq crds`: run make crds"
    assert top_files == chart_files, "crds/ and helm/bucketq/crds/ differ: run make crds"
    rendered = [d for d in render(include_crds=True) if d["kind"] == "CustomResourceDefinition"]
    assert sorted(rendered, key=lambda d: d["metadata"]["name"]) == sorted(
        (yaml.safe_load(t) for t in generated.values()), key=lambda d: d["metadata"]["name"]
    )


@pytest.mark.parametrize("path", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_example_custom_resources_are_valid_against_the_charts_crds(path: str) -> None:
    crds = load_crds(CHART / "crds")
    for doc in yaml.safe_load_all((REPO / "examples" / path).read_text()):
        if doc["apiVersion"].split("/")[0] != "bucketq.io":
            continue
        errors, unknown = custom_resource_problems(crds, doc)
        assert not errors, f"examples/{path}: {doc['kind']} {doc['metadata']['name']} is invalid: {errors}"
        assert not unknown, f"examples/{path}: unknown fields {unknown}"


def test_chart_packages_with_crds_schema_and_notes(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("bucketq-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for wanted in (
        "bucketq/values.schema.json",
        "bucketq/templates/NOTES.txt",
        "bucketq/crds/topics.bucketq.io.yaml",
        "bucketq/files/dashboard-queues.json",
    ):
        assert wanted in names, f"{wanted} is not in the packaged chart"


def test_chart_lints_without_a_single_notice() -> None:
    """`helm lint --strict` passes on warnings only; the icon notice is an [INFO]: none is left."""
    result = helm("lint", "--strict", str(CHART))
    notices = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert not notices, f"helm lint has something to say:\n{result.stdout}"


def test_packaged_chart_carries_icon_and_registry_metadata(tmp_path: Path) -> None:
    """What `make chart` packages: what `helm push` turns into the OCI manifest's annotations
    (org.opencontainers.image.title/version/description/url/source/authors) and what Artifact Hub
    shows (icon, license, images, CRDs), each consistent with the rest of the repository."""
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("bucketq-*.tgz")
    meta = yaml.safe_load(helm("show", "chart", str(archive)).stdout)
    assert archive.name == f"bucketq-{meta['version']}.tgz"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", meta["version"]), "OCI tags need SemVer"
    assert meta["name"] == "bucketq" and meta["description"]
    assert meta["home"] == "https://github.com/bucketq/bucketq" and meta["sources"][0] == meta["home"]
    assert meta["maintainers"] and all(
        m.get("name") and (m.get("url") or m.get("email")) for m in meta["maintainers"]
    )
    # the icon is this repository's file, at the URL registries fetch it from
    prefix = "https://raw.githubusercontent.com/bucketq/bucketq/main/"
    assert meta["icon"].startswith(prefix), meta["icon"]
    icon = REPO / meta["icon"].removeprefix(prefix)
    import xml.etree.ElementTree as ET

    svg = ET.parse(icon).getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    _, _, width, height = map(float, svg.attrib["viewBox"].split())
    assert width == height, "Artifact Hub shows icons square"
    annotations = meta["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    images = yaml.safe_load(annotations["artifacthub.io/images"])
    assert images == [{"name": "bucketq", "image": f"{values['image']['repository']}:{meta['appVersion']}"}]
    from bucketq.operator.models import KINDS

    listed = yaml.safe_load(annotations["artifacthub.io/crds"])
    crds = load_crds(CHART / "crds")
    assert [c["kind"] for c in listed] == [k.kind for k in KINDS]
    for entry, kind in zip(listed, KINDS, strict=True):
        crd = crds[("bucketq.io", kind.kind)]
        assert entry["name"] == crd["metadata"]["name"]
        assert entry["version"] == crd["spec"]["versions"][0]["name"]
        assert entry["description"] == (kind.spec.__doc__ or "").strip()


def test_make_chart_packages_and_pushes_the_versioned_archive() -> None:
    plan = subprocess.run(
        [
            "make",
            "-n",
            "-o",
            ".venv/.installed",
            "chart-push",
            "CHART_REGISTRY=oci://registry.example.com/charts",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert "lint --strict helm/bucketq" in plan and "package helm/bucketq --destination dist" in plan
    assert f"push dist/bucketq-{version}.tgz oci://registry.example.com/charts" in plan, plan


def test_notes_explain_the_install(tmp_path: Path) -> None:
    result = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    notes = result.stdout.split("NOTES:", 1)[1]
    for needle in (
        'bucketq.io/inject: "true"',
        "create secret generic bucketq-s3",
        # the sidecars' key is each namespace's own, limited to its prefix (docs/security.md)
        "create secret generic bucketq-sidecar-s3",
        '"Resource": "arn:aws:s3:::bucketq/NAMESPACE/*"',
        '"Condition": {"StringLike": {"s3:prefix": ["NAMESPACE/*"]}}',
        "Never copy the operator's Secret",
        "bucketq.io/consumer: billing",
        "bucketq.io/token-secret",
        "bucketq_subscription_backlog",
        "kubectl apply -f examples/",
    ):
        assert needle in notes, f"NOTES.txt does not mention {needle!r}:\n{notes}"
    for example in re.findall(r"kubectl apply -f (examples/\S+)", notes):
        assert (REPO / example).exists(), f"NOTES.txt points at {example}, which does not exist"


# -- values.schema.json ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy"),
        ({"image": {"tag": "latest"}}, "/image/tag"),
        ({"image": {"digest": "sha256:nothex"}}, "/image/digest"),
        ({"operatr": {"namespaces": []}}, "operatr"),
        ({"webhook": {"port": 70000}}, "/webhook/port"),
        ({"webhook": {"insecure": True}}, "insecure"),
        ({"webhook": {"replicas": 1}}, "/webhook/replicas"),
        ({"webhook": {"objectSelector": {"matchLabels": {"a": "b"}}}}, "objectSelector"),
        ({"s3": {"bucket": ""}}, "/s3/bucket"),
        ({"s3": {"strategy": "yolo"}}, "/s3/strategy"),
        ({"operator": {"namespaces": ["Not_A_Namespace"]}}, "/operator/namespaces/0"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"operator": {"leaderElection": {"leaseDurationSeconds": 0}}}, "/operator/leaderElection"),
        ({"sidecar": {"resources": {"requests": {"cpu": "lots"}}}}, "/sidecar/resources/requests/cpu"),
        ({"metrics": {"podMonitor": {"interval": "soon"}}}, "/metrics/podMonitor/interval"),
        ({"keda": {"scaledObjects": [{"name": "w", "scaleTargetRef": {"name": "w"}}]}}, "consumer"),
        ({"certManager": {"issuerRef": {"name": "x", "kind": "Secret"}}}, "/certManager/issuerRef/kind"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"networkPolicy": {"metrics": {"podSelector": {"app": "x"}}}}, "/networkPolicy/metrics"),
    ],
)
def test_values_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    result = template(values, check=False)
    assert result.returncode != 0, f"the chart accepted {values}"
    assert complaint in result.stderr, f"the error does not name {complaint!r}:\n{result.stderr}"


# A refused value names the rule it breaks in words: helm prints the failing keyword (a bare `not`
# prints "'not' failed", a pattern prints the regular expression), so each such rule is written as
# `if: <breaks the rule>, then: {const: <reason>}` and helm prints "value must be '<reason>'".
@pytest.mark.parametrize(
    ("values", "path", "reason"),
    [
        (
            {"image": {"tag": "latest"}},
            "/image/tag",
            "latest is refused because it moves under a running release",
        ),
        ({"image": {"tag": "1.0 beta"}}, "/image/tag", "a fixed image tag such as 0.1.0"),
        (
            {"image": {"digest": "sha256:nothex"}},
            "/image/digest",
            "sha256: followed by 64 lowercase hexadecimal",
        ),
        ({"s3": {"bucket": "My_Bucket"}}, "/s3/bucket", "an S3 bucket name: 3 to 63 lowercase letters"),
        ({"s3": {"existingSecret": "Creds"}}, "/s3/existingSecret", "empty, or a DNS-1123 label"),
        ({"s3": {"endpointUrl": "minio:9000"}}, "/s3/endpointUrl", "an http:// or https:// URL"),
        ({"sidecar": {"s3Secret": "S3"}}, "/sidecar/s3Secret", "none: no credentials, for pod identity"),
        ({"operator": {"namespaces": ["Shop"]}}, "/operator/namespaces/0", "a DNS-1123 label"),
        (
            {"sidecar": {"resources": {"limits": {"memory": "lots"}}}},
            "/sidecar/resources/limits/memory",
            "a Kubernetes quantity",
        ),
        (
            {"metrics": {"podMonitor": {"interval": "soon"}}},
            "/metrics/podMonitor/interval",
            "a duration such as 30s, 5m or 1h30m",
        ),
        (
            {"operator": {"extraEnv": [{"name": "1X", "value": "v"}]}},
            "/operator/extraEnv/0/name",
            "an environment variable name",
        ),
        ({"webhook": {"replicas": 1}}, "/webhook/replicas", "one replica answers while another is drained"),
        (
            {"metrics": {"prometheusRule": {"alertLabels": {"severity": "page"}}}},
            "/metrics/prometheusRule/alertLabels/severity",
            "each alert sets its own severity",
        ),
        (
            {"keda": {"operatorUrl": "http://op:9090/?x=1"}},
            "/keda/operatorUrl",
            "without ?query or #fragment",
        ),
    ],
)
def test_values_schema_says_why_a_value_is_refused(values: dict[str, Any], path: str, reason: str) -> None:
    for args in (["template", RELEASE, str(CHART)], ["lint", "--strict", str(CHART)]):
        result = helm(*args, "--values", "-", stdin=yaml.safe_dump(values), check=False)
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"helm {args[0]} accepted {values}"
        assert f"at '{path}': value must be '" in output and reason in output, (
            f"helm {args[0]} does not say why {values} is refused ({reason!r}):\n{output}"
        )
        assert "'not' failed" not in output and "does not match pattern" not in output, output


def test_values_schema_has_no_rule_that_fails_without_a_reason() -> None:
    """No bare `not`, `pattern` or `anyOf` (helm prints only the keyword or the expression): each rule
    is an `if` whose `then` is the reason."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    bare: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            bare.extend(f"{path}: {k}" for k in ("not", "pattern", "anyOf", "oneOf") if k in node)
            if "if" in node:
                assert set(node["then"]) == {"const"} and " " in node["then"]["const"], path
            for key, value in node.items():
                if key != "if":  # the rule itself, inside the condition
                    walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(schema, "")
    assert not bare, f"rules helm would report without a reason: {bare}"


def test_integrations_asked_for_without_their_api_fail_clearly() -> None:
    result = template({"certManager": {"enabled": True}}, check=False)
    assert result.returncode != 0 and "cert-manager.io/v1" in result.stderr
    result = template({"keda": FULL["keda"]}, check=False)
    assert result.returncode != 0 and "keda.sh/v1alpha1" in result.stderr


# -- the operator Deployment ------------------------------------------------------------------------------


def _secrets_for(container: Doc) -> dict[str, dict[str, str]]:
    """Stand-in Secrets for every secretKeyRef of ``container`` (value: "name:key")."""
    out: dict[str, dict[str, str]] = {}
    for item in container.get("env") or ():
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            out.setdefault(ref["name"], {})[ref["key"]] = f"{ref['name']}:{ref['key']}"
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_operator_reads_every_setting_the_chart_gives_it(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every BUCKETQ_* variable is a real setting and the operator's settings load from them."""
    from bucketq.config import Settings

    values, apis = SCENARIOS[scenario]
    container = operator_container(render(values, api_versions=apis))
    env = container_env(container, _secrets_for(container), POD_FIELDS)
    settings = operator_settings_from_env(env)
    engine_fields = {f"BUCKETQ_{name.upper()}" for name in Settings.model_fields}
    for name in env:
        if name in ("POD_NAME", "POD_NAMESPACE"):  # the replica's name and namespace for the Lease
            continue
        assert name.startswith("BUCKETQ_OPERATOR_") or name in engine_fields, f"{name} is no bucketq setting"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    engine = Settings.load()
    assert container["args"][0] == "operator"
    assert engine.backend == "s3" and engine.s3_bucket == (values.get("s3") or {}).get("bucket", "bucketq")
    assert settings.webhook is False and not settings.webhook_only, "the webhook Deployment serves it"
    assert settings.peering is None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_webhook_replicas_read_every_setting_the_chart_gives_them(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook container: webhook-only, TLS, the chart's failurePolicy, and no S3 credentials."""
    from bucketq.config import Settings

    values, apis = SCENARIOS[scenario]
    docs = render(values, api_versions=apis)
    enabled = (values.get("webhook") or {}).get("enabled", True)
    if not enabled:
        assert not [d for d in find(docs, "Deployment") if "webhook" in d["metadata"]["name"]]
        return
    container = webhook_container(docs)
    env = container_env(container)  # no secretKeyRef at all: it would fail here
    settings = operator_settings_from_env(env)
    engine_fields = {f"BUCKETQ_{name.upper()}" for name in Settings.model_fields}
    for name in env:
        assert name.startswith("BUCKETQ_OPERATOR_") or name in engine_fields, f"{name} is no bucketq setting"
    assert container["args"][:2] == ["operator", "--webhook-only"]
    assert settings.webhook and settings.webhook_only and settings.peering is None
    assert not settings.webhook_insecure, "the chart never runs the webhook without TLS"
    assert settings.webhook_managed is False, "the chart owns the MutatingWebhookConfiguration"
    assert settings.metrics_port == 0
    for webhook in one(docs, "MutatingWebhookConfiguration")["webhooks"]:
        assert webhook["failurePolicy"] == settings.webhook_failure_policy
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    engine = Settings.load()
    assert engine.s3_access_key_id is None and engine.s3_secret_access_key is None


def test_operator_is_a_hardened_replica(defaults: list[Doc]) -> None:
    deployment = component(defaults, "Deployment", "operator")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = operator_container(defaults)
    sc = container["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"]
        and not sc["allowPrivilegeEscalation"]
        and sc["capabilities"]["drop"] == ["ALL"]
    )
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9090, "health": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


@pytest.mark.parametrize("replicas", [None, 1, 3])
def test_operator_replicas_elect_one_leader(replicas: int | None) -> None:
    """Several replicas, one working (leader election over a Lease in the release namespace);
    upgrades add a standby before they stop a replica; drains take one replica at a time."""
    docs = render({} if replicas is None else {"operator": {"replicas": replicas}})
    deployment = component(docs, "Deployment", "operator")
    spec = deployment["spec"]
    expected = 2 if replicas is None else replicas
    assert spec["replicas"] == expected
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    container = operator_container(docs)
    env = container_env(container, _secrets_for(container), POD_FIELDS)
    settings = operator_settings_from_env(env)
    assert settings.leader_election and not settings.webhook and settings.peering is None
    assert (
        settings.leader_lease_duration_s,
        settings.leader_renew_deadline_s,
        settings.leader_retry_period_s,
    ) == (
        15.0,
        10.0,
        2.0,
    )
    assert settings.leader_lease_name == FULLNAME
    assert (env["POD_NAME"], env["POD_NAMESPACE"]) == (
        POD_FIELDS["metadata.name"],
        POD_FIELDS["metadata.namespace"],
    )
    pod = spec["template"]
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert (
        spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    )
    assert selector_matches(spread["labelSelector"], pod["metadata"]["labels"])
    budgets = find(docs, "PodDisruptionBudget", deployment["metadata"]["name"])
    if expected == 1:
        assert not budgets, "a budget on a single replica would block every node drain"
        return
    (budget,) = budgets
    assert budget["spec"]["maxUnavailable"] == 1
    assert selector_matches(budget["spec"]["selector"], pod["metadata"]["labels"])
    webhook_pod = component(docs, "Deployment", "webhook")["spec"]["template"]
    assert not selector_matches(budget["spec"]["selector"], webhook_pod["metadata"]["labels"])


@pytest.mark.parametrize("values", [{}, {"webhook": {"replicas": 3}}])
def test_webhook_is_served_by_several_replicas_through_disruptions(values: dict[str, Any]) -> None:
    docs = render(values)
    deployment = component(docs, "Deployment", "webhook")
    spec = deployment["spec"]
    assert spec["replicas"] == (values.get("webhook") or {}).get("replicas", 2) >= 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }, "an upgrade adds a ready replica before it removes one"
    pod = spec["template"]
    budget = component(docs, "PodDisruptionBudget", "webhook")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert selector_matches(budget["spec"]["selector"], pod["metadata"]["labels"])
    operator_pod = component(docs, "Deployment", "operator")["spec"]["template"]
    assert not selector_matches(budget["spec"]["selector"], operator_pod["metadata"]["labels"])
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert (
        spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    )
    assert selector_matches(spread["labelSelector"], pod["metadata"]["labels"])
    container = webhook_container(docs)
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    # the Service selects these pods, and only these
    service = one(docs, "Service", f"{FULLNAME}-webhook")
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    assert not selector_matches(
        {"matchLabels": service["spec"]["selector"]}, operator_pod["metadata"]["labels"]
    )
    assert pod["spec"]["serviceAccountName"] != operator_pod["spec"]["serviceAccountName"]


def test_images_default_to_the_released_version(defaults: list[Doc], full: list[Doc]) -> None:
    import tomllib

    from bucketq.operator.config import DEFAULT_SIDECAR_IMAGE

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    image = f"ghcr.io/bucketq/bucketq:{version}"
    assert image == DEFAULT_SIDECAR_IMAGE
    container = operator_container(defaults)
    assert container["image"] == image == webhook_container(defaults)["image"]
    assert container_env(webhook_container(defaults))["BUCKETQ_OPERATOR_SIDECAR_IMAGE"] == image
    pinned = operator_container(full)
    assert (
        pinned["image"] == f"registry.example.com/team/bucketq@{DIGEST}" == webhook_container(full)["image"]
    )
    assert container_env(webhook_container(full))["BUCKETQ_OPERATOR_SIDECAR_IMAGE"] == pinned["image"]


def test_sidecar_defaults_reach_the_injected_container(full: list[Doc]) -> None:
    """The chart's sidecar values, through the operator's env, shape the container it injects."""
    from bucketq.config import Settings
    from bucketq.operator.injection import Wiring, sidecar_container

    container = webhook_container(full)
    env = container_env(container, _secrets_for(container))
    settings = operator_settings_from_env(env)
    engine = Settings.from_dict(
        {"backend": "s3", "s3_bucket": "queues", "s3_endpoint_url": "http://minio.storage:9000"}
    )
    sidecar = sidecar_container(
        Wiring("billing", ["orders"], "pull", None, None, None), {}, engine, settings, settings.sidecar_native
    )
    assert sidecar["resources"] == FULL["sidecar"]["resources"]
    assert sidecar["image"] == container["image"] and sidecar["imagePullPolicy"] == "IfNotPresent"
    assert "restartPolicy" not in sidecar, "sidecar.native=false gives a plain container"
    sidecar_env = {e["name"]: e for e in sidecar["env"]}
    assert sidecar_env["BUCKETQ_S3_ENDPOINT_URL"]["value"] == "http://minio.storage.svc:9000"
    assert sidecar_env["BUCKETQ_SIDECAR_LISTEN_PORT"]["value"] == "4500"
    # The sidecars' own Secret (each namespace's prefix-scoped key), never the operator's by default.
    assert sidecar_env["BUCKETQ_S3_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
        "name": "bucketq-sidecar-s3",
        "key": "user",
    }
    assert FULL["s3"]["existingSecret"] != "bucketq-sidecar-s3"


# -- RBAC ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rbac_grants_exactly_what_the_operator_calls(scenario: str) -> None:
    values, apis = SCENARIOS[scenario]
    docs = render(values, api_versions=apis)
    container = operator_container(docs)
    settings = operator_settings_from_env(container_env(container, _secrets_for(container), POD_FIELDS))
    needed = operator_permissions(settings)
    sa = component(docs, "Deployment", "operator")["spec"]["template"]["spec"]["serviceAccountName"]
    # the Lease of the leader election lives in the release namespace
    lease = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    _check_grants(docs, sa, settings.namespaces, needed, release=lease if settings.leader_election else set())
    if (values.get("webhook") or {}).get("enabled", True):
        container = webhook_container(docs)
        settings = operator_settings_from_env(container_env(container))
        sa = component(docs, "Deployment", "webhook")["spec"]["template"]["spec"]["serviceAccountName"]
        _check_grants(docs, sa, settings.namespaces, webhook_permissions(settings))


def webhook_permissions(settings: Any) -> dict[bool, set[Any]]:
    """What a webhook-only operator calls: list/watch of what it indexes, kopf's scanning; no writes.

    kopf writes nothing for index handlers (no finalizer, no annotations) and posts no events
    for them or for admission handlers (their loggers are local).
    """
    import kopf

    from bucketq.config import Settings
    from bucketq.operator.handlers import Operator
    from bucketq.operator.runner import kopf_settings
    from bucketq.operator.webhook import DIRECT_READS

    registry: Any = Operator(Settings.from_dict({"backend": "memory"}), settings).register(
        kopf.OperatorRegistry()
    )
    assert not any(
        r.get_all_handlers() for r in (registry._watching, registry._changing, registry._spawning)
    ), "a webhook-only operator handles nothing but its index and admission reviews"
    namespaced = {
        (h.selector.group, h.selector.any_name, verb)
        for h in registry._indexing.get_all_handlers()
        for verb in ("list", "watch")
    } | DIRECT_READS  # a Consumer the index has not delivered yet is read before a pod is refused
    ks = kopf_settings(settings)
    assert ks.peering.standalone and not ks.admission.managed and not ks.scanning.disabled
    cluster = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
    if settings.namespaces:
        cluster |= {("", "namespaces", v) for v in ("list", "watch")}
    return {True: namespaced, False: cluster}


def _check_grants(
    docs: list[Doc],
    sa: str,
    namespaces: list[str],
    needed: dict[bool, set[Any]],
    release: set[Any] | None = None,
) -> None:
    """``release``: what the account needs in the release namespace only (the Lease)."""
    assert one(docs, "ServiceAccount", sa)
    grants = granted(docs, sa, NAMESPACE)
    if release:
        assert release <= grants.get(NAMESPACE, set()), (
            f"{sa}: lacks {release - grants.get(NAMESPACE, set())}"
        )
        grants[NAMESPACE] = grants[NAMESPACE] - release
        if not grants[NAMESPACE]:
            del grants[NAMESPACE]
    if namespaces:
        assert grants[None] == needed[False], f"{sa}: cluster-wide grants differ from its cluster-wide calls"
        for ns in namespaces:
            assert grants.get(ns) == needed[True], f"{sa}: grants in {ns} differ from its calls there"
        assert set(grants) == {None, *namespaces}, f"{sa}: grants in namespaces not served: {set(grants)}"
    else:
        assert grants == {None: needed[True] | needed[False]}, sa


def test_rbac_has_no_secret_access_or_escalation(defaults: list[Doc], full: list[Doc]) -> None:
    for docs in (defaults, full):
        for role in find(docs, "ClusterRole") + find(docs, "Role"):
            for _, resource, verb in rules_permissions(role["rules"]):
                assert resource not in ("secrets", "pods", "clusterroles", "roles", "rolebindings"), resource
                assert verb not in ("escalate", "bind", "impersonate", "delete", "deletecollection"), verb


# -- the admission webhook: selection and TLS ----------------------------------------------------------------


def _mwc(docs: list[Doc]) -> Doc:
    """The first webhook of the configuration (both share service, TLS, policy and namespaces)."""
    webhooks = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert len(webhooks) == 2
    return dict(webhooks[0])


def _webhooks(docs: list[Doc]) -> dict[str, Doc]:
    return {w["name"]: w for w in one(docs, "MutatingWebhookConfiguration")["webhooks"]}


def _managed_webhooks(settings: Any, service: Doc) -> dict[str, Doc]:
    """What the operator itself writes as its MutatingWebhookConfiguration (kopf's managed mode)."""
    import kopf
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines.admission import build_webhooks

    from bucketq.config import Settings
    from bucketq.operator.handlers import Operator

    registry = Operator(Settings.from_dict({"backend": "memory"}), settings).register(kopf.OperatorRegistry())
    pods = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
    client = {"service": {"name": service["name"], "namespace": service["namespace"], "port": 443}}
    built = build_webhooks(
        registry._webhooks.get_all_handlers(),
        resources=[pods],
        name_suffix="bucketq.io",
        client_config=client,
    )
    return {w["name"]: w for w in built}


@pytest.mark.parametrize("scenario", ["defaults", "everything-changed"])
def test_chart_and_operator_configure_the_same_webhooks(scenario: str) -> None:
    """One failurePolicy, one set of selectors: the chart's configuration is the operator's own."""
    values, apis = SCENARIOS[scenario]
    docs = render(values, api_versions=apis)
    chart = _webhooks(docs)
    container = webhook_container(docs)
    settings = operator_settings_from_env(container_env(container))
    service = next(iter(chart.values()))["clientConfig"]["service"]
    managed = _managed_webhooks(settings, service)
    assert set(chart) == set(managed) == {"inject-consumer.bucketq.io", "inject-sidecar.bucketq.io"}
    expected_policy = (values.get("webhook") or {}).get("failurePolicy", "Fail")
    for name, ours in chart.items():
        theirs = managed[name]
        assert ours["failurePolicy"] == theirs["failurePolicy"] == expected_policy, name
        assert ours["objectSelector"] == theirs["objectSelector"], name
        assert ours["sideEffects"] == theirs["sideEffects"] == "None", name
        assert ours["clientConfig"]["service"]["path"] == theirs["clientConfig"]["service"]["path"], name
        assert ours["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert [r["operations"] for r in theirs["rules"]] == [["CREATE"]]
    # and the operator's own default is the chart's default
    from bucketq.operator.config import OperatorSettings

    assert OperatorSettings().webhook_failure_policy == "Fail"


def test_webhook_reaches_the_operators_handler(defaults: list[Doc]) -> None:
    for webhook in _webhooks(defaults).values():
        service = webhook["clientConfig"]["service"]
        svc = one(defaults, "Service", service["name"])
        assert service["namespace"] == NAMESPACE
        (port,) = [p for p in svc["spec"]["ports"] if p["port"] == service["port"]]
        container = webhook_container(defaults)
        target = next(p for p in container["ports"] if p["name"] == port["targetPort"])
        env = container_env(container)
        assert str(target["containerPort"]) == env["BUCKETQ_OPERATOR_WEBHOOK_PORT"]
        assert selector_matches(
            {"matchLabels": svc["spec"]["selector"]},
            component(defaults, "Deployment", "webhook")["spec"]["template"]["metadata"]["labels"],
        )
    assert _mwc(render(FULL, api_versions=ALL_APIS))["failurePolicy"] == "Ignore"


@pytest.mark.parametrize(
    ("labels", "path"),
    [
        ({"bucketq.io/consumer": "billing", "app": "w"}, "/inject-consumer"),  # the label alone
        ({"bucketq.io/consumer": "billing", "bucketq.io/inject": "true"}, "/inject-consumer"),
        ({"bucketq.io/inject": "true", "app": "w"}, "/inject-sidecar"),
        ({"app": "w"}, None),
        ({"bucketq.io/inject": "false"}, None),
    ],
)
def test_only_pods_asking_for_a_sidecar_are_sent_to_the_webhook(
    labels: dict[str, str], path: str | None, defaults: list[Doc]
) -> None:
    webhooks = _webhooks(defaults).values()
    sent = [
        w["clientConfig"]["service"]["path"]
        for w in webhooks
        if selector_matches(w["objectSelector"], labels)
    ]
    assert sent == ([path] if path else []), "at most one webhook per pod, none for unlabelled pods"
    for webhook in webhooks:
        assert "matchConditions" not in webhook, "the labels alone decide: annotations are optional"


def test_webhooks_skip_system_and_unserved_namespaces(defaults: list[Doc], full: list[Doc]) -> None:
    for webhook in _webhooks(defaults).values():
        selector = webhook["namespaceSelector"]
        assert not selector_matches(selector, {"kubernetes.io/metadata.name": "kube-system"})
        assert selector_matches(selector, {"kubernetes.io/metadata.name": "shop"})
    for webhook in _webhooks(full).values():
        scoped = webhook["namespaceSelector"]
        assert selector_matches(scoped, {"kubernetes.io/metadata.name": "billing"})
        assert not selector_matches(scoped, {"kubernetes.io/metadata.name": "default"})


def test_webhook_tls_from_the_chart_generated_ca(defaults: list[Doc]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    webhook = _mwc(defaults)
    deployment = component(defaults, "Deployment", "webhook")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-tls")
    secret = one(defaults, "Secret", volume["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/tls"
    data = secret_data(secret)
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    key = serialization.load_pem_private_key(data["tls.key"], password=None)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    service = webhook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in sans
    # every replica mounts this one Secret: one caBundle trusts them all
    env = container_env(webhook_container(defaults))
    mount = next(m for m in webhook_container(defaults)["volumeMounts"] if m["name"] == "webhook-tls")
    assert env["BUCKETQ_OPERATOR_WEBHOOK_CERT_FILE"] == f"{mount['mountPath']}/tls.crt"
    assert env["BUCKETQ_OPERATOR_WEBHOOK_KEY_FILE"] == f"{mount['mountPath']}/tls.key"
    assert deployment["spec"]["replicas"] >= 2
    # the Deployment's checksum is of this very certificate: a new one rolls the replicas
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    material = json.dumps(dict(sorted(secret["data"].items())), separators=(",", ":")).encode()
    assert annotations["checksum/webhook-tls"] == hashlib.sha256(material).hexdigest()


def test_webhook_tls_from_cert_manager(full: list[Doc]) -> None:
    webhook = _mwc(full)
    assert "caBundle" not in webhook["clientConfig"]
    assert not find(full, "Secret"), "with cert-manager the chart makes no certificate itself"
    certificate = one(full, "Certificate", f"{FULLNAME}-webhook")
    mwc = one(full, "MutatingWebhookConfiguration")
    assert (
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{FULLNAME}-webhook"
    )
    service = webhook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    volume = next(
        v
        for v in component(full, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "webhook-tls"
    )
    assert certificate["spec"]["secretName"] == volume["secret"]["secretName"]
    issuer = one(full, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca_cert = one(full, "Certificate", issuer["spec"]["ca"]["secretName"])
    assert ca_cert["spec"]["isCA"] is True
    assert one(full, "Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    existing = render(
        {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}},
        api_versions=["cert-manager.io/v1"],
    )
    assert not find(existing, "Issuer")
    assert one(existing, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_webhook_is_only_ever_rendered_with_tls(scenario: str) -> None:
    values, apis = SCENARIOS[scenario]
    docs = render(values, api_versions=apis)
    enabled = (values.get("webhook") or {}).get("enabled", True)
    configs = find(docs, "MutatingWebhookConfiguration")
    assert len(configs) == (1 if enabled else 0)
    assert bool(find(docs, "Service", f"{FULLNAME}-webhook")) == enabled
    for config in configs:
        for webhook in config["webhooks"]:
            client = webhook["clientConfig"]
            assert "url" not in client and client["service"]["port"] == 443
            injected = "cert-manager.io/inject-ca-from" in (config["metadata"].get("annotations") or {})
            assert client.get("caBundle") or injected, "a webhook without a CA to trust"
            svc = one(docs, "Service", client["service"]["name"])
            assert [p["name"] for p in svc["spec"]["ports"]] == ["https"]
    env = container_env(operator_container(docs), _secrets_for(operator_container(docs)), POD_FIELDS)
    assert env["BUCKETQ_OPERATOR_WEBHOOK"] == "false", "the operator never serves the webhook"
    assert len(find(docs, "Deployment")) == (2 if enabled else 1)
    if enabled:
        env = container_env(webhook_container(docs))
        assert env["BUCKETQ_OPERATOR_WEBHOOK"] == "true"
        assert "BUCKETQ_OPERATOR_WEBHOOK_INSECURE" not in env


# -- monitoring, dashboard, KEDA ---------------------------------------------------------------------------


def test_prometheus_operator_objects_only_when_the_api_exists(defaults: list[Doc]) -> None:
    assert not find(defaults, "ServiceMonitor") and not find(defaults, "PodMonitor")
    docs = render(api_versions=MONITORING_APIS)
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    assert selector_matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (
        endpoint["port"] in [p["name"] for p in service["spec"]["ports"]] and endpoint["honorLabels"] is True
    )
    pod_monitor = one(docs, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    # the label the webhook puts on every pod it injects, whichever label asked for the sidecar
    assert selector_matches(pod_monitor["spec"]["selector"], {"bucketq.io/injected": "true"})
    assert not selector_matches(pod_monitor["spec"]["selector"], {"bucketq.io/consumer": "billing"})
    off = render(
        {"metrics": {"serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": False}}},
        api_versions=MONITORING_APIS,
    )
    assert not find(off, "ServiceMonitor") and not find(off, "PodMonitor")


def test_pod_monitor_scrapes_the_port_the_operator_injects(defaults: list[Doc]) -> None:
    from bucketq.config import Settings
    from bucketq.operator.injection import Wiring, sidecar_container

    docs = render(api_versions=MONITORING_APIS)
    container = webhook_container(docs)  # the webhook replicas inject the sidecars
    settings = operator_settings_from_env(container_env(container))
    sidecar = sidecar_container(
        Wiring(None, [], "pull", None, None, None),
        {},
        Settings.from_dict({"backend": "s3", "s3_bucket": "b"}),
        settings,
        True,
    )
    (endpoint,) = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in sidecar["ports"]]


def exported_metric_names() -> set[str]:
    """Sample names the operator and the sidecar expose (counters as _total, histograms as _bucket...)."""
    from bucketq.operator.metrics import QueueMetrics
    from bucketq.sidecar.metrics import Metrics

    names: set[str] = set()
    for registry in (QueueMetrics().registry, Metrics().registry):
        for family in registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(
                family.type, [""]
            )
            names |= {family.name + s for s in suffixes}
    return names


def queries(full: list[Doc]) -> list[str]:
    """PromQL of the dashboard, the chart's ScaledObjects and the example ScaledObjects."""
    dashboard = json.loads(one(full, "ConfigMap", f"{FULLNAME}-dashboard")["data"]["bucketq-queues.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    examples = [d for p in (REPO / "examples").glob("*.yaml") for d in yaml.safe_load_all(p.read_text())]
    for so in find(full, "ScaledObject") + find(examples, "ScaledObject"):
        exprs += [t["metadata"]["query"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
    return exprs


def test_dashboard_and_keda_queries_are_valid_promql_on_real_metrics(full: list[Doc], tmp_path: Path) -> None:
    exprs = queries(full)
    assert len(exprs) > 10
    known = exported_metric_names()
    for expr in exprs:
        for name in re.findall(r"\bbucketq_[a-z_]+\b", expr):
            assert name in known, f"{expr!r} uses {name}, which neither the operator nor the sidecar exports"
    promtool = tools.promtool()
    rules = {
        "groups": [
            {
                "name": "bucketq",
                "rules": [
                    {"record": f"bucketq:check{i}", "expr": e.replace("$namespace", ".*")}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"promtool rejects a query:\n{result.stdout}{result.stderr}"


def test_dashboard_configmap_is_optional(defaults: list[Doc], full: list[Doc]) -> None:
    assert not find(defaults, "ConfigMap")
    configmap = one(full, "ConfigMap", f"{FULLNAME}-dashboard")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_keda_scaled_object_scales_on_the_operators_replicas_answer(full: list[Doc]) -> None:
    (so,) = find(full, "ScaledObject")
    assert so["metadata"]["namespace"] == "billing"
    assert so["spec"]["scaleTargetRef"] == {"name": "billing-worker"} and so["spec"]["maxReplicaCount"] == 20
    (trigger,) = so["spec"]["triggers"]
    # the default trigger needs no Prometheus: the operator answers the replicas, KEDA targets 1 each
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert (meta["format"], meta["valueLocation"], meta["targetValue"], meta["activationTargetValue"]) == (
        "json",
        "replicas",
        "1",
        "0",
    )
    service = one(full, "Service", f"{FULLNAME}-metrics")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics"]
    assert meta["url"] == (
        f"http://{FULLNAME}-metrics.{NAMESPACE}.svc:{port}/scaling/billing/billing"
        "?messagesPerReplica=50&activation=0"
    ), "backlogPerReplica, the former name, still sets messagesPerReplica"


def _scaled_objects(keda: dict[str, Any]) -> list[Doc]:
    return find(render({"keda": keda}, api_versions=ALL_APIS), "ScaledObject")


def test_keda_prometheus_trigger_scales_on_pending_and_lease_holders() -> None:
    objects = [{"name": "w", "namespace": "shop", "consumer": "billing", "scaleTargetRef": {"name": "w"}}]
    (so,) = _scaled_objects(
        {
            "trigger": "prometheus",
            "prometheusServerAddress": "http://prom.example:9090",
            "scaledObjects": [{**objects[0], "messagesPerReplica": 40, "activationMessages": 5}],
        }
    )
    pending, holders = so["spec"]["triggers"]
    assert {pending["type"], holders["type"]} == {"prometheus"}
    assert pending["metadata"]["query"] == (
        'sum(bucketq_subscription_pending{namespace="shop",consumer="billing"}) or vector(0)'
    )
    assert (pending["metadata"]["threshold"], pending["metadata"]["activationThreshold"]) == ("40", "5")
    # the HPA takes the larger proposal: never fewer replicas than members holding leases
    assert holders["metadata"]["query"] == (
        'max(bucketq_consumer_lease_holders{namespace="shop",consumer="billing"}) or vector(0)'
    )
    assert (holders["metadata"]["threshold"], holders["metadata"]["activationThreshold"]) == ("1", "0")
    assert {t["metadata"]["serverAddress"] for t in (pending, holders)} == {"http://prom.example:9090"}
    # one object may differ from the default trigger; the operator's URL can be given
    mixed = _scaled_objects(
        {
            "operatorUrl": "http://metrics.example:9999/",
            "scaledObjects": [
                {**objects[0], "name": "a"},
                {**objects[0], "name": "b", "trigger": "prometheus"},
            ],
        }
    )
    assert [[t["type"] for t in so["spec"]["triggers"]] for so in mixed] == [
        ["metrics-api"],
        ["prometheus", "prometheus"],
    ]
    url = mixed[0]["spec"]["triggers"][0]["metadata"]["url"]
    assert url == "http://metrics.example:9999/scaling/shop/billing?messagesPerReplica=100&activation=0"


_SO = {"name": "w", "consumer": "c", "scaleTargetRef": {"name": "w"}}


@pytest.mark.parametrize(
    ("keda", "complaint"),
    [
        ({"trigger": "cpu"}, "/keda/trigger"),
        ({"operatorUrl": "bq-bucketq-metrics:9090"}, "/keda/operatorUrl"),
        ({"scaledObjects": [{**_SO, "messagesPerReplica": 0}]}, "messagesPerReplica"),
        ({"scaledObjects": [{**_SO, "trigger": "kafka"}]}, "trigger"),
        ({"networkPolicy": {"podSelector": {"app": "keda"}}}, "/keda/networkPolicy/podSelector"),
    ],
)
def test_keda_values_are_checked(keda: dict[str, Any], complaint: str) -> None:
    result = template({"keda": keda}, api_versions=ALL_APIS, check=False)
    assert result.returncode != 0, f"the chart accepted {keda}"
    assert complaint in result.stderr, f"the error does not name {complaint!r}:\n{result.stderr}"


def test_keda_metrics_api_url_is_answered_by_the_operator(full: list[Doc]) -> None:
    """The rendered URL, asked of the operator's real metrics server, yields the value KEDA reads."""
    import asyncio
    import urllib.parse

    import aiohttp

    from bucketq.core.models import TopicConfig
    from bucketq.core.stats import SubscriptionStats
    from bucketq.core.topics import TopicInfo
    from bucketq.operator.metrics import QueueMetrics
    from bucketq.operator.topics import TopicFigures
    from tests.support.servers import free_ports

    (so,) = find(full, "ScaledObject")
    meta = so["spec"]["triggers"][0]["metadata"]
    url = urllib.parse.urlsplit(meta["url"])
    sub = SubscriptionStats(
        topic="orders",
        consumer="billing",
        messages=120,
        backlog=118,
        in_flight=2,
        delayed=0,
        acked=0,
        dead_lettered=0,
        redelivered=0,
        oldest_age_s=1.0,
        partitions=[],
        holders=["m1", "m2"],
    )
    info = TopicInfo(name="orders", config=TopicConfig(), created_at=0.0, consumers=["billing"])

    async def ask() -> tuple[int, Any]:
        metrics = QueueMetrics()
        metrics.set_topic("billing", "orders", TopicFigures(info, [sub]))
        (port,) = free_ports(1)
        runner = await metrics.serve("127.0.0.1", port)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}{url.path}?{url.query}") as resp,
            ):
                return resp.status, await resp.json()
        finally:
            await runner.cleanup()

    status, body = asyncio.run(ask())
    assert status == 200, body
    value = body[meta["valueLocation"]]
    assert value == 3, "ceil(120 pending / 50 per replica) = 3, above the 2 lease holders"


# -- NetworkPolicy ------------------------------------------------------------------------------------------


def _ingress_ports(policy: Doc) -> dict[int, list[Doc] | None]:
    """Port -> its rule's peers (None: any source) of a NetworkPolicy's ingress rules."""
    out: dict[int, list[Doc] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            out[port["port"]] = rule.get("from")
    return out


def test_network_policy_is_off_by_default(defaults: list[Doc]) -> None:
    assert find(defaults, "NetworkPolicy") == []


def test_network_policy_admits_only_the_apiserver_and_the_scrapers(full: list[Doc]) -> None:
    policy = one(full, "NetworkPolicy", FULLNAME)
    pod = component(full, "Deployment", "operator")["spec"]["template"]
    assert selector_matches(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress (apiserver, S3) stays open"
    ports = {p["name"]: p["containerPort"] for p in operator_container(full)["ports"]}
    allowed = _ingress_ports(policy)
    assert set(allowed) == {ports["metrics"]}, "the health port is the kubelet's only"
    webhook_policy = one(full, "NetworkPolicy", f"{FULLNAME}-webhook")
    webhook_pod = component(full, "Deployment", "webhook")["spec"]["template"]
    assert selector_matches(webhook_policy["spec"]["podSelector"], webhook_pod["metadata"]["labels"])
    assert not selector_matches(webhook_policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert webhook_policy["spec"]["policyTypes"] == ["Ingress"]
    webhook_port = next(p for p in webhook_container(full)["ports"] if p["name"] == "webhook")[
        "containerPort"
    ]
    assert _ingress_ports(webhook_policy) == {webhook_port: FULL["networkPolicy"]["apiServer"]["from"]}
    metrics = FULL["networkPolicy"]["metrics"]
    assert allowed[ports["metrics"]] == [
        {"namespaceSelector": metrics["namespaceSelector"], "podSelector": metrics["podSelector"]},
        # a ScaledObject with the metrics-api trigger: KEDA's operator calls the scaling endpoint
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}},
        },
    ], "one peer each: the pod selector AND the namespace selector"


def test_network_policy_admits_keda_only_for_metrics_api_triggers() -> None:
    so = {"name": "w", "consumer": "billing", "scaleTargetRef": {"name": "w"}}
    keda = {
        "trigger": "prometheus",
        "scaledObjects": [so],
        "networkPolicy": {"podSelector": {"matchLabels": {"app": "keda-operator"}}},
    }
    values: dict[str, Any] = {"networkPolicy": {"enabled": True}, "keda": keda}
    peers = _ingress_ports(one(render(values, api_versions=ALL_APIS), "NetworkPolicy", FULLNAME))[9090]
    assert peers is not None and len(peers) == 1, "Prometheus queries the operator's metrics, not KEDA"
    keda["scaledObjects"] = [so, {**so, "name": "v", "trigger": "metrics-api"}]
    peers = _ingress_ports(one(render(values, api_versions=ALL_APIS), "NetworkPolicy", FULLNAME))[9090]
    assert peers is not None and peers[1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
        "podSelector": {"matchLabels": {"app": "keda-operator"}},
    }


@pytest.mark.parametrize("webhook", [True, False])
def test_network_policy_defaults_when_enabled(webhook: bool) -> None:
    docs = render({"networkPolicy": {"enabled": True}, "webhook": {"enabled": webhook}})
    allowed = _ingress_ports(one(docs, "NetworkPolicy", FULLNAME))
    if webhook:
        # The apiserver cannot be selected by labels: any source, but on the webhook port only.
        assert _ingress_ports(one(docs, "NetworkPolicy", f"{FULLNAME}-webhook")) == {9443: None}
    else:
        assert len(find(docs, "NetworkPolicy")) == 1
    assert allowed == {
        9090: [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {},
            }
        ]
    }
