"""Helpers around the real helm binary and the rendered chart (shared by the chart and e2e tests)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import tools

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "bucketq"
RELEASE, NAMESPACE = "bq", "bucketq-system"
# Kubernetes versions the chart supports (Chart.yaml kubeVersion): oldest and newest validated.
OLDEST_KUBE, NEWEST_KUBE = "1.29.0", "1.37.0"
Doc = dict[str, Any]


def tool(name: str) -> str:
    """``helm`` or ``kubectl`` from ``make tools`` (.tools/bin), else from PATH; fails the test when
    neither exists (``BUCKETQ_TEST_SKIP=helm`` or ``=kubectl`` skips it: ``tests.support.tools``)."""
    return tools.binary(
        name, area=name, install="run `make tools` (it installs helm and kubectl into .tools/bin)"
    )


def helm(
    *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [tool("helm"), *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def template(
    values: Mapping[str, Any] | None = None,
    *,
    kube_version: str = NEWEST_KUBE,
    api_versions: Iterable[str] = (),
    include_crds: bool = False,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart with ``values`` (given on stdin, as a values file)."""
    args = [
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        kube_version,
        "--values",
        "-",
    ]
    for api in api_versions:
        args += ["--api-versions", api]
    if include_crds:
        args.append("--include-crds")
    return helm(*args, stdin=yaml.safe_dump(dict(values or {})), check=check)


def render(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[Doc]:
    """The chart's objects as rendered by ``helm template``."""
    return [d for d in yaml.safe_load_all(template(values, **kwargs).stdout) if d]


def find(docs: Iterable[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[Doc], kind: str, name: str | None = None) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}{' ' + name if name else ''}, found {len(found)}"
    return found[0]


def component(docs: Iterable[Doc], kind: str, name: str) -> Doc:
    """The one object of ``kind`` labelled app.kubernetes.io/component ``name`` (operator, webhook)."""
    found = [
        d for d in find(docs, kind) if d["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]
    assert len(found) == 1, f"expected one {kind} of component {name}, found {len(found)}"
    return found[0]


def operator_container(docs: Iterable[Doc]) -> Doc:
    deployment = component(docs, "Deployment", "operator")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "operator")


def webhook_container(docs: Iterable[Doc]) -> Doc:
    deployment = component(docs, "Deployment", "webhook")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "webhook")


def container_env(
    container: Mapping[str, Any],
    secrets: Mapping[str, Mapping[str, str]] | None = None,
    fields: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A container's environment as the kubelet resolves it: values, secretKeyRef, fieldRef, $(VAR)."""
    env: dict[str, str] = {}
    for item in container.get("env") or ():
        name = item["name"]
        if "value" in item:
            value = str(item["value"])
            for known, resolved in env.items():
                value = value.replace(f"$({known})", resolved)
            env[name] = value
            continue
        source = item.get("valueFrom") or {}
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = (secrets or {}).get(ref["name"])
            assert secret is not None and ref["key"] in secret, (
                f"env {name}: Secret {ref['name']}/{ref['key']} missing"
            )
            env[name] = secret[ref["key"]]
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            assert fields is not None and path in fields, f"env {name}: no value for field {path}"
            env[name] = fields[path]
        else:
            raise AssertionError(f"env {name}: unsupported source {source}")
    return env


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels and matchExpressions); empty matches all."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


Permission = tuple[str, str, str]  # (apiGroup, resource, verb)


def rules_permissions(rules: Iterable[Mapping[str, Any]]) -> set[Permission]:
    """Every (group, resource, verb) an RBAC rule list grants (wildcards are refused outright)."""
    out: set[Permission] = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, f"unexpected rule shape {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in RBAC rule {rule}"
                    out.add((group, resource, verb))
    return out


def granted(docs: Iterable[Doc], service_account: str, namespace: str) -> dict[str | None, set[Permission]]:
    """Permissions bound to a service account: key None for cluster-wide, else per namespace."""
    docs = list(docs)
    roles = {("ClusterRole", None, d["metadata"]["name"]): d for d in find(docs, "ClusterRole")}
    roles |= {("Role", d["metadata"]["namespace"], d["metadata"]["name"]): d for d in find(docs, "Role")}
    out: dict[str | None, set[Permission]] = {}
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        subjects = binding.get("subjects") or []
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == service_account and s["namespace"] == namespace
            for s in subjects
        ):
            continue
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        out.setdefault(scope, set()).update(rules_permissions(role["rules"]))
    return out


def operator_settings_from_env(env: Mapping[str, str]) -> Any:
    """The operator's settings exactly as its process reads them from ``env`` (and nothing else)."""
    from bucketq.operator.config import OperatorSettings

    prefix = "BUCKETQ_OPERATOR_"
    unknown = sorted(
        k
        for k in env
        if k.startswith(prefix) and k[len(prefix) :].lower() not in OperatorSettings.model_fields
    )
    assert not unknown, f"the chart sets operator settings that do not exist: {unknown}"
    saved = dict(os.environ)
    try:
        for name in [k for k in os.environ if k.startswith(prefix)]:
            del os.environ[name]
        os.environ.update({k: v for k, v in env.items() if k.startswith(prefix)})
        return OperatorSettings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def operator_permissions(settings: Any) -> dict[bool, set[Permission]]:
    """What the operator's kopf handlers call, derived from its registry and kopf settings.

    Returns {True: namespaced permissions, False: cluster-scoped ones}.
    """
    import kopf

    from bucketq.config import Settings
    from bucketq.operator.handlers import Operator
    from bucketq.operator.runner import kopf_settings
    from bucketq.operator.webhook import DIRECT_READS

    registry: Any = Operator(Settings.from_dict({"backend": "memory"}), settings).register(
        kopf.OperatorRegistry()
    )
    ks = kopf_settings(settings)
    namespaced: set[Permission] = set()
    cluster: set[Permission] = set()
    streams = [registry._watching, registry._changing, registry._indexing, registry._spawning]
    for group, plural in {
        (h.selector.group, h.selector.any_name) for r in streams for h in r.get_all_handlers()
    }:
        # list+watch: the streams; patch: finalizers and kopf's annotations; status: the handlers' status
        namespaced |= {
            (group, plural, "list"),
            (group, plural, "watch"),
            (group, plural, "patch"),
            (group, f"{plural}/status", "patch"),
        }
    namespaced.add(("", "events", "create"))  # kopf posts events about handler failures
    if settings.webhook:
        namespaced |= DIRECT_READS  # the injector's reads outside kopf's streams
    if not ks.scanning.disabled:
        cluster |= {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
        if settings.namespaces:
            cluster |= {("", "namespaces", v) for v in ("list", "watch")}
    if ks.admission.managed:
        cluster |= {
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", v)
            for v in ("list", "watch", "create", "patch")
        }
    if not ks.peering.standalone:
        namespaced |= {("kopf.dev", "kopfpeerings", v) for v in ("list", "watch", "patch")}
        cluster |= {("kopf.dev", "clusterkopfpeerings", v) for v in ("list", "watch", "patch")}
    return {True: namespaced, False: cluster}


def kubernetes_validator() -> list[str]:
    """The command line of kubernetes-validate (a dev dependency; its absence fails the test)."""
    try:
        import kubernetes_validate  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    except ImportError:
        pytest.fail("kubernetes-validate (a dev dependency) is not installed: run `make venv`", pytrace=False)
    return [sys.executable, "-m", "kubernetes_validate"]


def validate_kubernetes(
    docs: list[dict[str, Any]], kube_version: str, path: Path
) -> subprocess.CompletedProcess[str]:
    """Write ``docs`` to ``path`` and run ``kubernetes-validate --strict`` on them for
    ``kube_version``; the caller asserts on the result."""
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(
        [*kubernetes_validator(), "--strict", "-k", kube_version, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def load_crds(directory: Path) -> dict[tuple[str, str], Doc]:
    """The CustomResourceDefinitions of ``directory``, by (group, kind)."""
    return {
        (d["spec"]["group"], d["spec"]["names"]["kind"]): d
        for d in (yaml.safe_load(p.read_text()) for p in directory.glob("*.yaml"))
    }


def unknown_fields(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    """Fields the apiserver would reject under strict field validation (not in the structural schema)."""
    out: list[str] = []
    if (
        isinstance(value, dict)
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        for name, sub in value.items():
            if name not in schema["properties"]:
                out.append(f"{path}.{name}")
            elif name != "metadata":
                out += unknown_fields(schema["properties"][name], sub, f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += unknown_fields(schema["items"], item, f"{path}[{i}]")
    return out


def custom_resource_problems(crds: Mapping[tuple[str, str], Doc], doc: Doc) -> tuple[list[str], list[str]]:
    """A bucketq custom resource checked against its CRD's schema for its apiVersion, as the
    apiserver would: (schema errors, fields strict validation would reject)."""
    import jsonschema  # type: ignore[import-untyped, unused-ignore]

    group = doc["apiVersion"].split("/")[0]
    crd = crds[(group, doc["kind"])]
    (version,) = [v for v in crd["spec"]["versions"] if f"{group}/{v['name']}" == doc["apiVersion"]]
    schema = version["schema"]["openAPIV3Schema"]
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]
    return errors, unknown_fields(schema, doc)
