"""Check Kubernetes manifests offline: bucketq's custom resources against their JSON Schemas and CEL
rules, everything else against Kubernetes' own schemas (kubernetes-validate) where it is installed.

``python -m bucketq.operator.manifests FILE|DIR|- ...`` (``make check-manifests FILES=...``) prints
one line per resource and exits 1 when any is invalid. What the API server would refuse is refused
here too, without a cluster:

* the schema of :mod:`bucketq.operator.jsonschemas` (the same files kubeconform reads from
  ``schemas/``): types, bounds, enums, required and unknown fields, ``metadata.name``;
* the CRDs' CEL rules (``x-kubernetes-validations``) with cel-python, except transition rules
  (``oldSelf``), which compare with the stored object and so only the API server can check.

It needs ``jsonschema`` and, for the CEL rules, ``cel-python`` (both in the ``dev`` extra); without
cel-python the CEL rules are reported as not checked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bucketq.operator.jsonschemas import schemas
from bucketq.operator.models import GROUP

YAML_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class Verdict:
    """What the check says of one resource."""

    source: str  # file name and document number
    kind: str
    name: str
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None  # why it was not checked
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors and self.skipped is None

    def line(self) -> str:
        what = f"{self.source}: {self.kind} {self.name}"
        if self.errors:
            return f"{what} is invalid:\n" + "\n".join(f"  - {e}" for e in self.errors)
        if self.skipped is not None:
            return f"{what} skipped: {self.skipped}"
        return f"{what} is valid" + "".join(f" ({n})" for n in self.notes)


class CelRules:
    """Evaluates a schema's ``x-kubernetes-validations`` over an object, as the API server does on
    create (so transition rules, which need the stored object, are left out)."""

    def __init__(self) -> None:
        import celpy  # type: ignore[import-untyped, unused-ignore]

        self._celpy = celpy
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}

    def errors(self, schema: dict[str, Any], value: Any, path: str = "") -> Iterator[str]:
        for rule in schema.get("x-kubernetes-validations", ()):
            if "oldSelf" in rule["rule"]:
                continue
            try:
                ok = bool(self._program(rule["rule"]).evaluate({"self": self._celpy.json_to_cel(value)}))
                message = rule.get("message") or f"failed rule: {rule['rule']}"
            except Exception as exc:  # an evaluation error fails the rule, as in Kubernetes
                ok, message = False, f"{rule.get('message') or rule['rule']} ({exc})"
            if not ok:
                yield f"{path or '<root>'}: {message}"
        if isinstance(value, dict):
            for name, sub in schema.get("properties", {}).items():
                if name in value:
                    yield from self.errors(sub, value[name], f"{path}.{name}".lstrip("."))
        elif isinstance(value, list) and "items" in schema:
            for i, item in enumerate(value):
                yield from self.errors(schema["items"], item, f"{path}[{i}]")

    def _program(self, rule: str) -> Any:
        if rule not in self._programs:
            self._programs[rule] = self._env.program(self._env.compile(rule))
        return self._programs[rule]


def typed(schema: dict[str, Any], value: Any) -> Any:
    """``value`` with the types Kubernetes gives it: ``type: number`` is a double even when written 1."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        return {k: typed(properties[k], v) if k in properties else v for k, v in value.items()}
    if isinstance(value, list) and "items" in schema:
        return [typed(schema["items"], v) for v in value]
    return value


class Checker:
    """Checks documents; one instance compiles each schema and CEL rule once."""

    def __init__(self, kubernetes_version: str | None = None) -> None:
        import jsonschema  # type: ignore[import-untyped, unused-ignore]

        self._jsonschema = jsonschema
        self.kubernetes_version = kubernetes_version
        self._validators: dict[tuple[str, str], Any] = {}
        for schema in schemas().values():
            api_version = schema["properties"]["apiVersion"]["enum"][0]
            kind = schema["properties"]["kind"]["enum"][0]
            cls = jsonschema.validators.validator_for(schema)
            self._validators[(api_version, kind)] = (schema, cls(schema))
        try:
            self.cel: CelRules | None = CelRules()
        except ImportError:
            self.cel = None

    def check(self, doc: Any, source: str) -> Verdict:
        if not isinstance(doc, dict):
            return Verdict(source, "?", "?", errors=[f"not a Kubernetes object: {type(doc).__name__}"])
        api_version, kind = str(doc.get("apiVersion", "")), str(doc.get("kind", ""))
        name = str((doc.get("metadata") or {}).get("name", "<no name>"))
        verdict = Verdict(source, kind or "<no kind>", name)
        if not api_version or not kind:
            # a values file or other YAML beside the manifests: said, not failed
            verdict.skipped = "no apiVersion and kind: not a Kubernetes object"
        elif api_version.split("/")[0] == GROUP:
            self._check_custom(doc, api_version, kind, verdict)
        else:
            self._check_builtin(doc, verdict)
        return verdict

    def _check_custom(self, doc: dict[str, Any], api_version: str, kind: str, verdict: Verdict) -> None:
        found = self._validators.get((api_version, kind))
        if found is None:
            known = ", ".join(sorted(f"{a} {k}" for a, k in self._validators))
            verdict.errors.append(f"no bucketq kind {kind} in {api_version} (known: {known})")
            return
        schema, validator = found
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
            verdict.errors.append(_schema_error(error))
        if verdict.errors:
            return  # CEL rules assume a well-typed object (the API server runs them after the schema)
        if self.cel is None:
            verdict.notes.append("CEL rules not checked: cel-python is not installed")
        else:
            verdict.errors += self.cel.errors(schema, typed(schema, doc))

    def _check_builtin(self, doc: dict[str, Any], verdict: Verdict) -> None:
        try:
            import kubernetes_validate  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            verdict.skipped = "not a bucketq kind, and kubernetes-validate is not installed"
            return
        version = self.kubernetes_version or kubernetes_validate.latest_version()
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            verdict.skipped = f"no schema for {doc['apiVersion']} {doc['kind']}"
        except kubernetes_validate.ValidationError as exc:  # the first error only: it stops there
            where = ".".join(map(str, exc.path)) or "<root>"
            verdict.errors.append(f"{where}: {exc.message}")


def _schema_error(error: Any) -> str:
    """One line for a schema violation; a pattern's meaning (its field's description) beside it."""
    where = ".".join(map(str, error.absolute_path)) or "<root>"
    message = error.message
    description = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "pattern" and description:
        message = f"{error.instance!r} is not valid: {description.split(chr(10))[0]} (pattern {error.validator_value})"
    return f"{where}: {message}"


def documents(paths: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """(source, document) of every YAML document in ``paths`` (files, directories, ``-`` for stdin)."""
    for given in paths:
        if given == "-":
            yield from _documents("<stdin>", sys.stdin.read())
            continue
        path = Path(given)
        files = (
            sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file())
            if path.is_dir()
            else [path]
        )
        for file in files:
            yield from _documents(str(file), file.read_text())


def _documents(name: str, text: str) -> Iterator[tuple[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        yield name, _Unparsable(str(exc))
        return
    for i, doc in enumerate(docs):
        source = name if len(docs) == 1 else f"{name}#{i + 1}"
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            for j, item in enumerate(doc["items"] or ()):
                yield f"{source}.items[{j}]", item
        else:
            yield source, doc


@dataclass
class _Unparsable:
    problem: str


def check_paths(paths: Iterable[str], kubernetes_version: str | None = None) -> list[Verdict]:
    checker = Checker(kubernetes_version)
    out = []
    for source, doc in documents(paths):
        if isinstance(doc, _Unparsable):
            out.append(Verdict(source, "?", "?", errors=[f"not valid YAML: {doc.problem}"]))
        else:
            out.append(checker.check(doc, source))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bucketq.operator.manifests",
        description="Check Kubernetes manifests offline (bucketq's custom resources and built-in kinds).",
    )
    parser.add_argument("paths", nargs="+", metavar="FILE|DIR|-", help="YAML files, directories or - (stdin)")
    parser.add_argument(
        "-k",
        "--kubernetes-version",
        help="Kubernetes version for built-in kinds (default: the newest kubernetes-validate knows)",
    )
    args = parser.parse_args(argv)
    try:
        verdicts = check_paths(args.paths, args.kubernetes_version)
    except (ImportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for verdict in verdicts:
        print(verdict.line())
    invalid = sum(bool(v.errors) for v in verdicts)
    skipped = sum(v.skipped is not None for v in verdicts)
    print(
        f"{len(verdicts)} resources: {len(verdicts) - invalid - skipped} valid, "
        f"{invalid} invalid, {skipped} skipped"
    )
    return 1 if invalid or not verdicts else 0


if __name__ == "__main__":
    raise SystemExit(main())
