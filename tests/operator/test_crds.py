"""The generated CRDs: committed as generated, structural, accepted by Kubernetes' schemas, strict."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from bucketq.operator.crds import all_crds, rendered_files
from bucketq.operator.models import KINDS
from tests.operator.k8s_emulator import CelRules, apply_defaults

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {
    c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for c in all_crds()
}


def test_committed_crds_equal_the_generated_ones() -> None:
    files = rendered_files()
    committed = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    assert committed == files, "crds/ is stale: run `bucketq crds` (or `make crds`) and commit the result"


def test_bucketq_crds_command(tmp_path: Path) -> None:
    from bucketq.cli.app import app

    runner = CliRunner()
    done = runner.invoke(app, ["crds", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(rendered_files())
    assert runner.invoke(app, ["crds", "--check", "--out", str(tmp_path)]).exit_code == 0
    (tmp_path / "topics.bucketq.io.yaml").write_text("stale")
    assert runner.invoke(app, ["crds", "--check", "--out", str(tmp_path)]).exit_code == 1


@pytest.mark.parametrize("crd", all_crds(), ids=lambda c: c["metadata"]["name"])
def test_crds_are_valid_kubernetes_objects(crd: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(crd, "1.32", strict=True)


def walk(node: dict[str, Any], path: str = "") -> Any:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_schemas_are_structural(kind: str) -> None:
    env = celpy.Environment()
    for path, node in walk(SCHEMAS[kind]):
        assert "type" in node, f"{kind}{path} has no type"
        assert not {
            "additionalProperties",
            "uniqueItems",
            "$ref",
            "anyOf",
            "oneOf",
            "allOf",
            "nullable",
        } & set(node), f"{kind}{path} uses a construct structural schemas forbid"
        if "default" in node:
            jsonschema.Draft7Validator(node).validate(apply_defaults(node, copy.deepcopy(node["default"])))
        for rule in node.get("x-kubernetes-validations", []):
            env.compile(rule["rule"])  # every CEL rule parses
            assert rule["message"]


def valid(kind: str, spec: dict[str, Any], name: str = "orders") -> list[str]:
    """Errors of a custom resource against the CRD schema (after defaulting, as the apiserver does)."""
    obj = apply_defaults(
        SCHEMAS[kind],
        {
            "apiVersion": "bucketq.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": copy.deepcopy(spec),
        },
    )
    errors = [e.message for e in jsonschema.Draft7Validator(SCHEMAS[kind]).iter_errors(obj)]
    return errors + list(CelRules().errors(SCHEMAS[kind], obj, None, ""))


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["apiVersion"] == "bucketq.io/v1alpha1":
            assert valid(doc["kind"], doc["spec"], doc["metadata"]["name"]) == []


def test_defaults_fill_a_minimal_topic() -> None:
    obj = apply_defaults(SCHEMAS["Topic"], {"metadata": {"name": "t"}, "spec": {}})
    assert obj["spec"] == {
        "partitions": 1,
        "retentionSeconds": 604800,
        "maxMessageBytes": 262144,
        "deletionPolicy": "Retain",
    }


@pytest.mark.parametrize(
    ("kind", "spec", "fragment"),
    [
        ("Topic", {"partitions": 0}, "less than the minimum"),
        ("Topic", {"partitions": "four"}, "is not of type 'integer'"),
        ("Topic", {"partitions": 10001}, "greater than the maximum"),
        ("Topic", {"deletionPolicy": "Sometimes"}, "is not one of"),
        ("Topic", {"maxMessageBytes": 10}, "less than the minimum"),
        ("Topic", {"deadLetterPolicy": "Bad_Name"}, "does not match"),
        ("Consumer", {}, "'topics' is a required property"),
        ("Consumer", {"topics": []}, "should be non-empty"),
        ("Consumer", {"topics": ["UPPER"]}, "does not match"),
        ("Consumer", {"topics": ["a..b"]}, "does not match"),
        ("Consumer", {"topics": ["x" * 64]}, "is too long"),
        ("Consumer", {"topics": ["t"], "startPosition": "middle"}, "is not one of"),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "pull", "push": {"port": 80}}},
            "push settings need mode",
        ),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"port": 70000}}},
            "greater than the maximum",
        ),
        ("Consumer", {"topics": ["t"], "visibilityTimeoutSeconds": 0}, "less than the minimum"),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"retry": {"initialSeconds": 120}}}},
            "maxSeconds must be at least initialSeconds",  # maxSeconds defaults to 60
        ),
        (
            "Consumer",
            {
                "topics": ["t"],
                "delivery": {"mode": "push", "push": {"retry": {"initialSeconds": 9.5, "maxSeconds": 9}}},
            },
            "maxSeconds must be at least initialSeconds",  # an integer is a number, as in Kubernetes' CEL
        ),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"retry": {"multiplier": 0.5}}}},
            "less than the minimum",
        ),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"retry": {"initialSeconds": 0}}}},
            "less than the minimum",
        ),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"batchSize": 1001}}},
            "greater than the maximum",
        ),
        (
            "Consumer",
            {
                "topics": ["t"],
                "delivery": {"mode": "push", "push": {"format": "cloudevents-binary", "batchSize": 5}},
            },
            "batchSize must be 1",
        ),
        (
            "Consumer",
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"format": "xml"}}},
            "xml",
        ),
        ("DeadLetterPolicy", {"maxDeliveries": 0}, "less than the minimum"),
        (
            "DeadLetterPolicy",
            {"dropAction": "Discard", "deadLetterTopic": "dlq"},
            "needs dropAction: DeadLetter",
        ),
    ],
)
def test_invalid_specs_are_rejected(kind: str, spec: dict[str, Any], fragment: str) -> None:
    errors = valid(kind, spec)
    assert any(fragment in e for e in errors), errors


def test_long_names_are_rejected() -> None:
    assert any("at most 63 characters" in e for e in valid("Topic", {}, name="t" * 64))


@pytest.mark.parametrize(
    ("kind", "old", "new", "fragment"),
    [
        ("Topic", {"partitions": 4}, {"partitions": 2}, "partitions may only grow"),
        (
            "Consumer",
            {"topics": ["t"], "startPosition": "earliest"},
            {"topics": ["t"], "startPosition": "latest"},
            "startPosition is immutable",
        ),
    ],
)
def test_transition_rules(kind: str, old: dict[str, Any], new: dict[str, Any], fragment: str) -> None:
    def obj(spec: dict[str, Any]) -> dict[str, Any]:
        return apply_defaults(SCHEMAS[kind], {"metadata": {"name": "x"}, "spec": copy.deepcopy(spec)})

    assert any(fragment in e for e in CelRules().errors(SCHEMAS[kind], obj(new), obj(old), ""))
    assert not list(CelRules().errors(SCHEMAS[kind], obj(old), obj(old), ""))


def test_printer_columns_and_names() -> None:
    for kind, crd in zip(KINDS, all_crds(), strict=True):
        version = crd["spec"]["versions"][0]
        assert crd["spec"]["scope"] == "Namespaced" and version["subresources"] == {"status": {}}
        assert crd["spec"]["names"]["shortNames"] == list(kind.short_names)
        assert crd["spec"]["names"]["categories"] == ["bucketq"]
    topic_columns = [
        c["name"]
        for c in all_crds()[0]["spec"]["versions"][0]["additionalPrinterColumns"]
        if not c.get("priority")
    ]
    assert topic_columns == ["Partitions", "Backlog", "Ready", "Phase", "Age"]
    for crd in all_crds():
        (ready,) = [c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if c["name"] == "Ready"]
        assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
        assert ready["type"] == "string" and not ready.get("priority")


def test_push_retry_defaults_and_model_rule() -> None:
    """The schema fills in the retry defaults; the model applies the CEL rule's check itself."""
    from pydantic import ValidationError

    from bucketq.operator.models import ConsumerSpec

    obj = apply_defaults(
        SCHEMAS["Consumer"],
        {"metadata": {"name": "c"}, "spec": {"topics": ["t"], "delivery": {"mode": "push", "push": {}}}},
    )
    push = obj["spec"]["delivery"]["push"]
    assert push["batchSize"] == 1
    assert push["retry"] == {"initialSeconds": 1.0, "maxSeconds": 60.0, "multiplier": 2.0}
    spec = ConsumerSpec.model_validate(obj["spec"])
    assert spec.delivery.push is not None and spec.delivery.push.retry.max_seconds == 60.0
    with pytest.raises(ValidationError, match="maxSeconds must be at least initialSeconds"):
        ConsumerSpec.model_validate(
            {"topics": ["t"], "delivery": {"mode": "push", "push": {"retry": {"initialSeconds": 90}}}}
        )


def test_a_binary_cloudevents_push_with_batches_is_refused_by_the_operator_too() -> None:
    """The CEL rule's twin in the model: a spec that reached the operator without the API server's
    validation (an older CRD installed) is refused the same way, never injected half-valid."""
    from pydantic import ValidationError

    from bucketq.operator.models import ConsumerSpec

    with pytest.raises(ValidationError, match="batchSize must be 1"):
        ConsumerSpec.model_validate(
            {
                "topics": ["t"],
                "delivery": {"mode": "push", "push": {"format": "cloudevents-binary", "batchSize": 2}},
            }
        )
    spec = ConsumerSpec.model_validate(
        {"topics": ["t"], "delivery": {"mode": "push", "push": {"format": "cloudevents-binary"}}}
    )
    assert spec.delivery.push is not None and spec.delivery.push.format == "cloudevents-binary"
    assert ConsumerSpec.model_validate(
        {"topics": ["t"], "delivery": {"mode": "push", "push": {}}}
    ).delivery.push
