"""docs/quickstart-kubernetes.md, checked block by block, and examples/quickstart/ kept equal to it.

Every ```yaml block of the quickstart carries ``<!-- quickstart: file examples/quickstart/X -->``
and is that file, byte for byte. Kubernetes objects are validated with kubernetes-validate, bucketq
custom resources against the CRDs' openAPI schemas, the ``helm install``/``upgrade`` commands are
rendered by the real helm with their ``-f``/``--set`` values, and the manifests the ``kubectl apply``
commands name are applied with the real kubectl to the API emulator, where the operator (configured
exactly as the chart configures it) makes the Topic and the Consumer Ready and its webhook injects
the sidecar into the worker's pod template. Blocks marked ``<!-- quickstart: skip -->`` (kind-only
commands) are left out.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ship.chart_tools import (
    CHART,
    NEWEST_KUBE,
    OLDEST_KUBE,
    REPO,
    Doc,
    container_env,
    custom_resource_problems,
    find,
    helm,
    load_crds,
    one,
    operator_settings_from_env,
    selector_matches,
    validate_kubernetes,
)

DOC = REPO / "docs" / "quickstart-kubernetes.md"
QUICKSTART = REPO / "examples" / "quickstart"
WORKER_SOURCE = REPO / "examples" / "push_worker.py"
MARKER = re.compile(r"^<!--\s*quickstart:\s*(?P<body>.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
MAX_SKIPPED = 2  # skipped blocks are untested: keep them few (kind-only commands)
KEDA_API = "keda.sh/v1alpha1/ScaledObject"
SIDECAR = "bucketq-sidecar"


# -- reading the quickstart ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int
    file: str | None = None
    skip: bool = False


def parse(markdown: str) -> list[Block]:
    """The fenced blocks of ``markdown``, each with the marker on the line just above its fence."""
    out: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i] != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"line {start + 1}: unterminated code block"
        i += 1
        marker = MARKER.match(lines[start - 1]) if start else None
        file, skip = None, False
        if marker:
            words = marker["body"].split()
            if words == ["skip"]:
                skip = True
            elif len(words) == 2 and words[0] == "file":
                file = words[1]
            else:
                raise AssertionError(f"line {start}: unknown quickstart marker {marker['body']!r}")
        text = "\n".join(body) + "\n"
        out.append(Block(fence["lang"], text, start + 1, file, skip))
    return out


def blocks() -> list[Block]:
    return parse(DOC.read_text())


def shell_commands(blocks: list[Block]) -> list[list[str]]:
    """Every command of the sh blocks that are not skipped (continuations joined, comments dropped)."""
    out: list[list[str]] = []
    for block in blocks:
        if block.lang != "sh" or block.skip:
            continue
        for line in block.text.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def files_of(command: list[str]) -> list[str]:
    """The ``-f``/``--values`` arguments of a kubectl or helm command."""
    return [command[i + 1] for i, word in enumerate(command[:-1]) if word in ("-f", "--values", "--filename")]


def option(command: list[str], *names: str) -> str | None:
    for i, word in enumerate(command):
        if word in names and i + 1 < len(command):
            return command[i + 1]
        for name in names:
            if name.startswith("--") and word.startswith(f"{name}="):
                return word.split("=", 1)[1]
    return None


def manifests(path: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


def yaml_files() -> dict[str, Block]:
    return {b.file: b for b in blocks() if b.file is not None}


def is_manifest(path: str) -> bool:
    """A file of Kubernetes objects (else a Helm values file)."""
    return all("apiVersion" in d and "kind" in d for d in manifests(path))


def all_objects() -> list[Doc]:
    return [d for path in yaml_files() if is_manifest(path) for d in manifests(path)]


def by_kind(kind: str, name: str | None = None) -> Doc:
    return one(all_objects(), kind, name)


def kubectl_applies() -> list[list[str]]:
    return [c for c in shell_commands(blocks()) if c[:1] == ["kubectl"] and "apply" in c]


def helm_installs() -> list[list[str]]:
    return [c for c in shell_commands(blocks()) if c[:1] == ["helm"] and c[1] in ("install", "upgrade")]


# -- the document and the files --------------------------------------------------------------------------


def test_the_parser_reads_markers_and_refuses_unknown_ones() -> None:
    text = (
        "<!-- quickstart: skip -->\n```sh\nkind load x \\\n  y # load\n```\n"
        "<!-- quickstart: file examples/quickstart/a.yaml -->\n```yaml\na: 1\n```\n```sh\nhelm list\n```\n"
    )
    parsed = parse(text)
    assert [(b.lang, b.skip, b.file) for b in parsed] == [
        ("sh", True, None),
        ("yaml", False, "examples/quickstart/a.yaml"),
        ("sh", False, None),
    ]
    assert parsed[1].text == "a: 1\n"
    assert shell_commands(parsed) == [["helm", "list"]], "skipped blocks give no commands"
    with pytest.raises(AssertionError, match="unknown quickstart marker"):
        parse("<!-- quickstart: skip it -->\n```sh\nls\n```\n")
    with pytest.raises(AssertionError, match="unterminated"):
        parse("```yaml\na: 1\n")


def test_every_yaml_block_is_a_quickstart_file_and_skips_are_few() -> None:
    found = blocks()
    assert found, "the quickstart has no code blocks"
    for block in found:
        if block.lang == "yaml":
            assert block.file is not None, f"line {block.line}: a yaml block without its file marker"
            assert block.file.startswith("examples/quickstart/"), block.file
            assert not block.skip
        else:
            assert block.file is None, f"line {block.line}: a file marker on a {block.lang} block"
        assert block.lang in ("yaml", "sh", "text"), f"line {block.line}: unexpected block {block.lang!r}"
    files = [b.file for b in found if b.file]
    assert len(files) == len(set(files)), "two blocks claim the same file"
    skipped = [b.line for b in found if b.skip]
    assert 0 < len(skipped) <= MAX_SKIPPED, f"skipped blocks at lines {skipped}: keep them few"


def test_examples_quickstart_are_exactly_the_docs_blocks() -> None:
    documented = yaml_files()
    on_disk = {str(p.relative_to(REPO)) for p in QUICKSTART.iterdir()}
    assert on_disk == set(documented), (
        f"examples/quickstart/ and the quickstart's file blocks differ: only on disk "
        f"{sorted(on_disk - set(documented))}, only in the doc {sorted(set(documented) - on_disk)}"
    )
    for path, block in documented.items():
        assert (REPO / path).read_text() == block.text, f"{path} differs from its block (line {block.line})"


def test_the_configmap_embeds_exactly_the_example_worker() -> None:
    configmap = by_kind("ConfigMap", "push-worker")
    (script,) = configmap["data"]
    assert configmap["data"][script] == WORKER_SOURCE.read_text(), (
        "the ConfigMap in the quickstart drifted from examples/push_worker.py"
    )
    deployment = by_kind("Deployment", "billing-worker")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    command = container["command"]
    assert command[:2] == ["python", f"{mount['mountPath']}/{script}"], command
    push = by_kind("Consumer", "billing")["spec"]["delivery"]["push"]
    assert option(command, "--port") == str(push["port"]) == str(container["ports"][0]["containerPort"])
    assert option(command, "--path") == push["path"]
    assert container["image"] == f"ghcr.io/bucketq/bucketq:{chart_meta()['appVersion']}"


def chart_meta() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "Chart.yaml").read_text()))


def test_the_doc_names_the_charts_image_version() -> None:
    version = chart_meta()["appVersion"]
    named = set(re.findall(r"ghcr\.io/bucketq/bucketq:([\w.+-]+)", DOC.read_text()))
    assert named == {version}, f"the quickstart names image versions {named}, the chart's is {version}"


# -- validation ------------------------------------------------------------------------------------------


@pytest.mark.e2e  # helm / kubernetes-validate processes
@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
def test_builtin_objects_are_valid_kubernetes(kube_version: str, tmp_path: Path) -> None:
    docs = [d for d in all_objects() if not d["apiVersion"].startswith("bucketq.io/")]
    assert {d["kind"] for d in docs} >= {"Namespace", "Secret", "Deployment", "Service", "ConfigMap"}
    result = validate_kubernetes(docs, kube_version, tmp_path / "builtins.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == len(docs), result.stdout


def test_custom_resources_are_valid_against_the_crds() -> None:
    crds = load_crds(REPO / "crds")
    custom = [d for d in all_objects() if d["apiVersion"].startswith("bucketq.io/")]
    assert {d["kind"] for d in custom} == {"Topic", "Consumer", "DeadLetterPolicy"}
    for doc in custom:
        errors, unknown = custom_resource_problems(crds, doc)
        assert not errors, f"{doc['kind']} {doc['metadata']['name']}: {errors}"
        assert not unknown, unknown


def test_kubectl_applies_every_manifest_and_only_quickstart_files() -> None:
    applied = [path for command in kubectl_applies() for path in files_of(command)]
    assert applied, "the quickstart applies nothing"
    for path in applied:
        assert path in yaml_files() and is_manifest(path), f"kubectl apply -f {path}: no manifest block"
    manifest_files = {p for p in yaml_files() if is_manifest(p)}
    assert manifest_files <= set(applied), f"never applied: {sorted(manifest_files - set(applied))}"
    for command in helm_installs():
        for path in files_of(command):
            assert path in yaml_files() and not is_manifest(path), f"helm -f {path}: no values block"


# -- the chart, rendered as the doc installs it -----------------------------------------------------------


def render_command(command: list[str], api_versions: tuple[str, ...] = ()) -> list[Doc]:
    """``helm template`` with the release, chart, namespace, ``-f`` and ``--set`` of a doc command."""
    release, chart = command[2], command[3]
    assert (REPO / chart).resolve() == CHART, f"{' '.join(command)}: not the chart of this repository"
    args = ["template", release, str(CHART), "--kube-version", NEWEST_KUBE]
    args += ["--namespace", option(command, "--namespace", "-n") or "default"]
    for i, word in enumerate(command[:-1]):
        if word in ("-f", "--values"):
            args += ["--values", str(REPO / command[i + 1])]
        elif word in ("--set", "--set-string"):
            args += [word, command[i + 1]]
    for api in api_versions:
        args += ["--api-versions", api]
    done = helm(*args, check=False)
    assert done.returncode == 0, f"{' '.join(command)} does not render:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def doc_secrets(namespace: str) -> dict[str, dict[str, str]]:
    return {
        d["metadata"]["name"]: dict(d["stringData"])
        for d in find(all_objects(), "Secret")
        if d["metadata"]["namespace"] == namespace
    }


def install_command() -> list[str]:
    (install,) = [c for c in helm_installs() if c[1] == "install"]
    return install


def chart_container(docs: list[Doc], name: str) -> Doc:
    """The container ``name`` of the chart's Deployments (operator: reconciles; webhook: injects)."""
    found = [
        c
        for d in find(docs, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == name
    ]
    assert len(found) == 1, f"expected one {name} container in the chart, found {len(found)}"
    return dict(found[0])


def chart_env(docs: list[Doc], namespace: str, container: str) -> dict[str, str]:
    """A chart container's environment as the kubelet resolves it, with the Secrets the doc creates."""
    fields = {"metadata.namespace": namespace, "metadata.name": "bq-bucketq-0", "status.podIP": "10.0.0.1"}
    return container_env(chart_container(docs, container), doc_secrets(namespace), fields)


def injecting_container(docs: list[Doc]) -> str:
    """The container serving the webhook: its own Deployment when the chart has one."""
    names = {c["name"] for d in find(docs, "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
    return "webhook" if "webhook" in names else "operator"


@pytest.mark.e2e  # helm / kubernetes-validate processes
def test_the_install_renders_with_the_docs_values_and_secrets() -> None:
    command = install_command()
    namespace = option(command, "--namespace", "-n")
    assert namespace is not None
    docs = render_command(command)
    env = chart_env(docs, namespace, "operator")  # fails unless the doc makes the operator's Secret
    service = by_kind("Service", "seaweedfs")
    endpoint = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:8333"
    assert env["BUCKETQ_S3_ENDPOINT_URL"] == endpoint
    assert env["BUCKETQ_S3_ACCESS_KEY_ID"] == doc_secrets(namespace)["bucketq-s3"]["accessKeyId"]
    settings = operator_settings_from_env(chart_env(docs, namespace, injecting_container(docs)))
    worker_ns = by_kind("Deployment", "billing-worker")["metadata"]["namespace"]
    sidecar_secret = doc_secrets(worker_ns)[settings.sidecar_secret]
    assert set(sidecar_secret) >= {
        settings.sidecar_secret_access_key_id_key,
        settings.sidecar_secret_secret_access_key_key,
    }
    (deployment,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == "bq-bucketq"]
    assert f"deployment/{deployment['metadata']['name']}" in DOC.read_text(), "the rollout command's name"
    dashboard = one(docs, "ConfigMap", f"{deployment['metadata']['name']}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert f"get configmap {dashboard['metadata']['name']}" in DOC.read_text()


@pytest.mark.e2e  # helm / kubernetes-validate processes
def test_the_charts_webhook_receives_the_worker_pods() -> None:
    """The MutatingWebhookConfiguration sends the worker's pods to the handler that serves them."""
    from bucketq.operator.webhook import SELECTORS
    from tests.operator.test_webhook import webhook_path

    template = by_kind("Deployment", "billing-worker")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}
    wanted = webhook_path(pod)
    assert wanted is not None and wanted.lstrip("/") in SELECTORS
    config = one(render_command(install_command()), "MutatingWebhookConfiguration")
    calling = [
        w["clientConfig"]["service"]["path"]
        for w in config["webhooks"]
        if selector_matches(w.get("objectSelector") or {}, template["metadata"]["labels"])
    ]
    assert calling == [wanted], (
        f"the chart calls {calling} for the worker's pods, the operator serves {wanted}"
    )
    assert {w["failurePolicy"] for w in config["webhooks"]} == {"Fail"}, "the doc says Fail"


@pytest.mark.e2e  # helm / kubernetes-validate processes
def test_the_keda_upgrade_scales_the_worker_on_its_consumer() -> None:
    (upgrade,) = [c for c in helm_installs() if c[1] == "upgrade"]
    assert files_of(install_command()) == files_of(upgrade)[: len(files_of(install_command()))], (
        "the upgrade keeps the install's values"
    )
    done = helm(*["template", *upgrade[2:4], "--values", str(REPO / files_of(upgrade)[-1])], check=False)
    assert done.returncode != 0 and "install KEDA first" in done.stderr, "without KEDA the chart says so"
    docs = render_command(upgrade, (KEDA_API,))
    scaled = one(docs, "ScaledObject", "billing-worker")
    worker = by_kind("Deployment", "billing-worker")
    assert scaled["metadata"]["namespace"] == worker["metadata"]["namespace"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    ns = worker["metadata"]["namespace"]
    triggers = json.dumps(scaled["spec"]["triggers"])
    # metrics-api asks the operator's scaling endpoint; prometheus queries the Consumer's series
    assert f"/scaling/{ns}/billing" in triggers or (
        f'namespace=\\"{ns}\\"' in triggers and 'consumer=\\"billing\\"' in triggers
    ), triggers
    assert scaled["spec"]["minReplicaCount"] == 0


# -- the steps on the API emulator, with the operator configured as the chart configures it ---------------

# Built-in kinds the emulator stores, and where (kubectl cannot discover its core group, so these are
# created through the API; the custom resources go through the real kubectl). The others (Service,
# ConfigMap) are only validated above.
BUILTIN_PATHS = {
    "Namespace": "/api/v1/namespaces",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
}
CUSTOM = {"Topic", "Consumer", "DeadLetterPolicy"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, moto_server: Any) -> Iterator[dict[str, Any]]:
    """The emulator with the chart's CRDs, and the operator with the chart's settings on a moto bucket."""
    from tests.operator.harness import Kube, port_open, start_operator, wait_for
    from tests.operator.k8s_emulator import EmulatorThread
    from tests.support.servers import free_ports

    command = install_command()
    namespace = option(command, "--namespace", "-n")
    assert namespace is not None
    docs = render_command(command)
    # The injecting replica's settings (sidecar image, Secret, ports, ...), reconciling as well here.
    settings = operator_settings_from_env(chart_env(docs, namespace, injecting_container(docs)))
    (port,) = free_ports(1)
    # Local serving only differs: plain HTTP on a free port, no health or metrics ports.
    settings = settings.model_copy(
        update={
            "webhook": True,
            "webhook_only": False,
            "webhook_insecure": True,
            "webhook_addr": "127.0.0.1",
            "webhook_port": port,
            "webhook_cert_file": None,
            "webhook_key_file": None,
            "liveness_port": 0,
            "metrics_port": 0,
            "status_interval_s": 1.0,
            "retry_min_s": 0.3,
            "retry_max_s": 2.0,
        }
    )
    emulator = EmulatorThread().start()
    kube = Kube(emulator.url)
    for crd in yaml.safe_load_all(helm("show", "crds", str(CHART)).stdout):
        if crd:
            kube.create(crd)
    config = tmp_path_factory.mktemp("quickstart") / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: emulator, cluster: {{server: "{emulator.url}"}}}}]\n'
        "users: [{name: tester, user: {}}]\n"
        "contexts: [{name: emulator, context: {cluster: emulator, user: tester}}]\n"
        "current-context: emulator\n"
    )
    engine = moto_server.settings(strategy="conditional_write")
    running = start_operator(emulator.url, engine, settings)
    try:
        wait_for(lambda: port_open(port), "the webhook server to listen")
        yield {"kube": kube, "kubeconfig": config, "port": port, "operator": running}
    finally:
        running.stop()
        emulator.stop()


def kubectl(cluster: dict[str, Any], *args: str, stdin: str | None = None) -> str:
    from tests.support import tools

    env = {**os.environ, "KUBECONFIG": str(cluster["kubeconfig"])}
    done = subprocess.run(
        [tools.kubectl(), *args], input=stdin, capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
    return done.stdout


@pytest.mark.s3  # the operator reconciles against the moto server
def test_the_steps_on_the_api_emulator(cluster: dict[str, Any]) -> None:
    from tests.operator.harness import wait_for
    from tests.operator.test_topics import ready
    from tests.operator.test_webhook import admitted, env_of, review

    kube = cluster["kube"]
    applied: list[str] = []
    for command in kubectl_applies():
        for path in files_of(command):
            docs = manifests(path)
            for doc in docs:
                if doc["kind"] in BUILTIN_PATHS:
                    ns = doc["metadata"].get("namespace", "")
                    kube.request("POST", BUILTIN_PATHS[doc["kind"]].format(ns=ns), doc)
            custom = [d for d in docs if d["kind"] in CUSTOM]
            if custom:
                # The emulator serves no OpenAPI documents: the schema checks happen server side.
                out = kubectl(
                    cluster, "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(custom)
                )
                applied += out.splitlines()
    assert "topic.bucketq.io/orders created" in applied and "consumer.bucketq.io/billing created" in applied
    worker = by_kind("Deployment", "billing-worker")
    ns = worker["metadata"]["namespace"]
    for plural, name in (
        ("topics", "orders"),
        ("consumers", "billing"),
        ("deadletterpolicies", "orders-dlp"),
    ):
        wait_for(partial(ready, kube, plural, ns, name), f"{plural}/{name} to be Ready", timeout=90)

    stored = kube.request("GET", BUILTIN_PATHS["Deployment"].format(ns=ns) + "/billing-worker")
    template = stored["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}
    wait_for(lambda: cluster["operator"].operator.injector is not None, "the injector")
    result = admitted(review(cluster["port"], copy.deepcopy(pod), ns), copy.deepcopy(pod))
    sidecar = result["spec"]["initContainers"][0]
    assert sidecar["name"] == SIDECAR and sidecar["restartPolicy"] == "Always"
    env = env_of(sidecar)
    push = by_kind("Consumer", "billing")["spec"]["delivery"]["push"]
    assert env["BUCKETQ_SIDECAR_CONSUMER"] == "billing" and env["BUCKETQ_SIDECAR_TOPICS"] == "orders"
    assert env["BUCKETQ_SIDECAR_DELIVERY"] == "push"
    assert (env["BUCKETQ_SIDECAR_APP_PORT"], env["BUCKETQ_SIDECAR_APP_PATH"]) == (
        str(push["port"]),
        push["path"],
    )
    # The Secret refs resolve against the Secret the doc creates in the worker namespace.
    fields = {"metadata.namespace": ns, "metadata.name": "billing-worker-0", "status.podIP": "10.0.0.2"}
    resolved = container_env(sidecar, doc_secrets(ns), fields)
    assert resolved["BUCKETQ_S3_ACCESS_KEY_ID"] == doc_secrets(ns)["bucketq-sidecar-s3"]["accessKeyId"]
    assert resolved["BUCKETQ_ROOT"].split("/")[-1] == ns
    (app,) = result["spec"]["containers"]
    assert app["name"] == "worker" and "BUCKETQ_SIDECAR_URL" in env_of(app)
    # The commands of step 7 name these containers.
    text = DOC.read_text()
    assert f"-c {sidecar['name']} -- bucketq publish orders" in text and f"-c {app['name']}" in text
