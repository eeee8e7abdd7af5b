"""JSON Schemas of the custom resources, for checking manifests offline (kubeconform's layout).

``kubectl apply --dry-run=client`` needs an API server; kubeconform, kubernetes-validate and editors
need a JSON Schema per kind. These are derived from the generated CRDs (so from the pydantic models)
the way kubeconform's ``openapi2jsonschema.py`` converts a CRD, plus what the API server checks
that a CRD's schema does not say:

* objects with ``properties`` get ``additionalProperties: false`` (the API server's strict field
  validation rejects unknown fields), the root included (a misspelt ``sepc:`` is an error);
* ``x-kubernetes-list-type: set`` lists get ``uniqueItems`` (the API server refuses duplicates);
* ``metadata.name`` gets the CRD's name rule (a DNS-1123 subdomain of at most
  :data:`~bucketq.operator.models.NAME_MAX` characters), which the CRD states as a CEL rule;
* ``apiVersion`` and ``kind`` are constants, so a schema never validates another kind.

CEL rules (``x-kubernetes-validations``) stay in the schema: JSON Schema validators ignore them,
:mod:`bucketq.operator.manifests` evaluates them. The files are laid out as
``{group}/{kind}_{version}.json`` (lowercase kind), the layout of kubeconform's CRD catalogs::

    kubeconform -strict -schema-location default \\
        -schema-location 'schemas/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json' FILE...

``make crds`` writes them into ``schemas/``; a test fails when they are out of date.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from bucketq.operator.crds import all_crds
from bucketq.operator.models import NAME_MAX, NAME_PATTERN

JSON_SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
# kubeconform's -schema-location template for these files, relative to the schemas directory
KUBECONFORM_LOCATION = "{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"


def schema_path(group: str, kind: str, version: str) -> str:
    """The file of a kind's schema, relative to the schemas directory (kubeconform's layout)."""
    return f"{group}/{kind.lower()}_{version}.json"


def json_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """The JSON Schema of one served version of ``crd``."""
    spec = crd["spec"]
    (served,) = [v for v in spec["versions"] if v["name"] == version]
    schema = _strict(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
    group, kind = spec["group"], spec["names"]["kind"]
    properties = schema["properties"]
    properties["apiVersion"] = {"type": "string", "enum": [f"{group}/{version}"]}
    properties["kind"] = {"type": "string", "enum": [kind]}
    properties["metadata"] = {
        "type": "object",
        "properties": {
            "name": {
                "description": f"A DNS-1123 subdomain of at most {NAME_MAX} characters "
                "(the name is a storage prefix).",
                "type": "string",
                "minLength": 1,
                "maxLength": NAME_MAX,
                "pattern": NAME_PATTERN,
            },
            "namespace": {"type": "string"},
        },
    }
    schema["required"] = sorted({"apiVersion", "kind", "metadata", *schema.get("required", ())})
    return {"$schema": JSON_SCHEMA_DIALECT, "title": f"{kind} ({group}/{version})", **schema}


def _strict(node: Any) -> Any:
    """kubeconform's conversion of a structural schema: closed objects, int-or-string, sets."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if out.get("x-kubernetes-int-or-string") or out.get("format") == "int-or-string":
        out.pop("type", None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def schemas() -> dict[str, dict[str, Any]]:
    """Relative path -> JSON Schema, for every served version of every custom resource."""
    out: dict[str, dict[str, Any]] = {}
    for crd in all_crds():
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                path = schema_path(spec["group"], spec["names"]["kind"], version["name"])
                out[path] = json_schema(crd, version["name"])
    return out


def rendered_files() -> dict[str, str]:
    """Relative path -> file text (stable JSON, what ``make crds`` writes)."""
    return {
        path: json.dumps(schema, indent=2, ensure_ascii=False) + "\n" for path, schema in schemas().items()
    }


def write_schemas(out_dir: Path) -> list[Path]:
    """Write every schema under ``out_dir``; returns the paths written."""
    written = []
    for relative, text in rendered_files().items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m bucketq.operator.jsonschemas [DIR]``: write the schemas into DIR (default schemas)."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "schemas")
    for path in write_schemas(out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
