"""Checking manifests offline: the JSON Schemas shipped in ``schemas/`` and ``make check-manifests``.

The schemas are what kubeconform reads (its CRD-catalog layout, found here through the very
``-schema-location`` template docs/operator.md tells users to pass); the make target is run exactly as
the docs write it. Each bad resource below is one the API server refuses (unknown field, type, enum,
bound, name rule, CEL rule): offline it must be refused too, with the reason.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.ship.chart_tools import REPO, load_crds

SCHEMAS = REPO / "schemas"
OPERATOR_DOC = REPO / "docs" / "operator.md"
TOPIC: dict[str, Any] = {
    "apiVersion": "bucketq.io/v1alpha1",
    "kind": "Topic",
    "metadata": {"name": "orders"},
    "spec": {"partitions": 4},
}
CONSUMER: dict[str, Any] = {
    "apiVersion": "bucketq.io/v1alpha1",
    "kind": "Consumer",
    "metadata": {"name": "billing", "namespace": "shop", "labels": {"team": "payments"}},
    "spec": {"topics": ["orders"], "delivery": {"mode": "push", "push": {"port": 8080}}},
}


def _with(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``doc`` with dotted paths set (``spec.partitions=0``); a value of ``...`` removes the key."""
    out = json.loads(json.dumps(doc))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return out


# (resource, what the complaint must say)
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "misspelt-spec": ({**TOPIC, "sepc": {}}, "'sepc' was unexpected"),
    "unknown-spec-field": (_with(TOPIC, spec__partitons=2), "'partitons' was unexpected"),
    "zero-partitions": (_with(TOPIC, spec__partitions=0), "spec.partitions: 0 is less than the minimum of 1"),
    "partitions-as-text": (_with(TOPIC, spec__partitions="four"), "spec.partitions: 'four' is not of type"),
    "bad-deletion-policy": (_with(TOPIC, spec__deletionPolicy="Sometimes"), "'Sometimes' is not one of"),
    "upper-case-name": (
        _with(TOPIC, metadata__name="Orders"),
        "metadata.name: 'Orders' is not valid: A DNS-1123",
    ),
    "name-too-long": (_with(TOPIC, metadata__name="o" * 64), "is too long"),
    "no-spec": (_with(TOPIC, spec=...), "'spec' is a required property"),
    "wrong-api-version": (
        _with(TOPIC, apiVersion="bucketq.io/v1"),
        "no bucketq kind Topic in bucketq.io/v1",
    ),
    "duplicate-topics": (_with(CONSUMER, spec__topics=["orders", "orders"]), "has non-unique elements"),
    "push-settings-in-pull-mode": (
        _with(CONSUMER, spec__delivery={"mode": "pull", "push": {"port": 8080}}),
        "spec.delivery: push settings need mode: push",
    ),
    "retry-max-below-initial": (
        _with(
            CONSUMER,
            spec__delivery={
                "mode": "push",
                "push": {"port": 8080, "retry": {"initialSeconds": 10, "maxSeconds": 1}},
            },
        ),
        "spec.delivery.push.retry:",
    ),
    "builtin-kind": (
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "w"},
            "spec": {"replicas": "two"},
        },
        "spec.replicas: 'two' is not of type 'integer'",
    ),
}


def documented_make_command() -> str:
    """The ``make check-manifests`` line of docs/operator.md."""
    (line,) = [
        line.strip()
        for line in OPERATOR_DOC.read_text().splitlines()
        if line.startswith("make check-manifests")
    ]
    return line


def check_manifests(files: list[Path]) -> subprocess.CompletedProcess[str]:
    """The documented command, run from the project root with FILES set to ``files``."""
    words = shlex.split(documented_make_command())
    assert words[:2] == ["make", "check-manifests"] and words[2].startswith("FILES="), words
    files_arg = "FILES=" + " ".join(shlex.quote(str(f)) for f in files)
    # -o: the venv counts as up to date (a test never reinstalls it)
    argv = [
        "make",
        "--no-print-directory",
        "-o",
        ".venv/.installed",
        "check-manifests",
        files_arg,
        *words[3:],
    ]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


# -- the shipped schemas ---------------------------------------------------------------------------


def test_shipped_schemas_are_the_generated_ones() -> None:
    from bucketq.operator.jsonschemas import rendered_files

    generated = rendered_files()
    shipped = {str(p.relative_to(SCHEMAS)): p.read_text() for p in SCHEMAS.rglob("*.json")}
    assert shipped == generated, "schemas/ differs from the CRDs' JSON Schemas: run make crds"
    plan = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "crds"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "-m bucketq.operator.jsonschemas schemas" in plan, (
        f"make crds does not regenerate schemas/:\n{plan}"
    )


def test_one_schema_per_served_kind_in_kubeconforms_layout() -> None:
    crds = load_crds(REPO / "crds")
    wanted = {
        f"{group}/{kind.lower()}_{v['name']}.json"
        for (group, kind), crd in crds.items()
        for v in crd["spec"]["versions"]
        if v["served"]
    }
    assert {str(p.relative_to(SCHEMAS)) for p in SCHEMAS.rglob("*.json")} == wanted
    assert len(wanted) == 3
    for path in wanted:
        jsonschema.Draft7Validator.check_schema(json.loads((SCHEMAS / path).read_text()))


def _kubeconform_lookup(doc: dict[str, Any]) -> Path:
    """The schema file kubeconform opens for ``doc`` with the docs' -schema-location template."""
    (template,) = re.findall(r"-schema-location '(schemas/[^']+)'", OPERATOR_DOC.read_text())
    group, _, version = doc["apiVersion"].rpartition("/")
    path = (
        template.replace("{{.Group}}", group)
        .replace("{{.ResourceKind}}", doc["kind"].lower())
        .replace("{{.ResourceAPIVersion}}", version)
    )
    return REPO / path


@pytest.mark.parametrize(
    "path", ["topic.yaml", "consumer.yaml", "deadletterpolicy.yaml", "quickstart/queue.yaml"]
)
def test_examples_are_valid_against_the_files_kubeconform_reads(path: str) -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "examples" / path).read_text()) if d]
    assert docs
    for doc in docs:
        schema = json.loads(_kubeconform_lookup(doc).read_text())
        errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
        assert not errors, f"examples/{path}: {doc['kind']} {doc['metadata']['name']}: {errors}"


@pytest.mark.parametrize(
    "case",
    ["misspelt-spec", "unknown-spec-field", "zero-partitions", "partitions-as-text", "bad-deletion-policy"],
)
def test_the_files_kubeconform_reads_refuse_what_the_api_server_refuses(case: str) -> None:
    doc, _ = BAD[case]
    schema = json.loads(_kubeconform_lookup(doc).read_text())
    assert list(jsonschema.Draft7Validator(schema).iter_errors(doc)), f"{case} passed the schema"
    # the chart's CRD (what the API server holds) refuses it too: the schema is not stricter
    from tests.ship.chart_tools import custom_resource_problems

    errors, unknown = custom_resource_problems(load_crds(REPO / "crds"), doc)
    assert errors or unknown, f"the CRD accepts {case}"


# -- make check-manifests ----------------------------------------------------------------------------


@pytest.mark.e2e  # make and python processes (the documented command)
def test_check_manifests_passes_the_examples_and_says_what_it_skipped() -> None:
    result = check_manifests([REPO / "examples"])
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    for line in (
        "examples/topic.yaml: Topic orders is valid",
        "examples/consumer.yaml: Consumer billing is valid",
        "examples/deadletterpolicy.yaml: DeadLetterPolicy orders-dlp is valid",
        "examples/worker-deployment.yaml: Deployment billing-worker is valid",
        "ScaledObject billing-worker skipped: no schema for keda.sh/v1alpha1 ScaledObject",
        "examples/quickstart/values.yaml: <no kind> <no name> skipped: no apiVersion and kind",
    ):
        assert line in out, f"missing {line!r}:\n{out}"
    assert "CEL rules not checked" not in out
    assert re.search(r"^\d+ resources: \d+ valid, 0 invalid, \d+ skipped$", out, re.MULTILINE), out


@pytest.mark.e2e  # make and python processes (the documented command)
@pytest.mark.parametrize("case", sorted(BAD))
def test_check_manifests_refuses_a_bad_resource_saying_why(case: str, tmp_path: Path) -> None:
    doc, complaint = BAD[case]
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump_all([TOPIC, CONSUMER]))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = check_manifests([good, bad])
    assert result.returncode != 0, f"{case} passed:\n{result.stdout}"
    assert f"{bad}: {doc['kind']} {doc['metadata']['name']} is invalid:" in result.stdout, result.stdout
    assert complaint in result.stdout, f"{case}: the output does not say {complaint!r}:\n{result.stdout}"
    assert f"{good}#1: Topic orders is valid" in result.stdout
    assert f"{good}#2: Consumer billing is valid" in result.stdout


@pytest.mark.e2e  # make and python processes (the documented command)
def test_check_manifests_reads_stdin_and_refuses_broken_yaml(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Topic\n  spec: [\n")
    result = check_manifests([broken])
    assert result.returncode != 0 and "is invalid:\n  - not valid YAML" in result.stdout, result.stdout
    piped = subprocess.run(
        [sys.executable, "-m", "bucketq.operator.manifests", "-"],
        input=yaml.safe_dump(_with(TOPIC, spec__partitions=-1)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert piped.returncode == 1 and "<stdin>: Topic orders is invalid" in piped.stdout, piped.stdout


def test_check_manifests_without_files_says_how() -> None:
    result = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", "check-manifests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0 and 'usage: make check-manifests FILES="' in result.stdout
