"""A Kubernetes API emulator for the operator tests: kmock's emulator, extended as kopf and kubectl need.

kmock 0.8 serves discovery and stores objects, but kopf and kubectl need more. This subclass adds:

* resourceVersion on every object and list, uid, generation (bumped on spec changes),
  creationTimestamp, 201 on create, 409 on conflicts, no-op patches that change nothing;
* watches that resume from a resourceVersion (an event log: nothing is lost between a list and
  the watch that follows it), with ``sendInitialEvents`` bookmarks and ``timeoutSeconds``;
* merge patches, JSON patches (with ``test`` ops failing as 422, as kopf expects), PUT;
* the status subresource: the main resource ignores status changes, ``/status`` changes only status;
* finalizers: DELETE sets deletionTimestamp while finalizers remain, the object goes when they do;
* CustomResourceDefinitions: creating one registers its resource for discovery, and custom
  resources are defaulted, pruned (strict field validation on request), validated with
  jsonschema against the openAPIV3Schema and with CEL (``x-kubernetes-validations``, celpy);
* server-side tables with the CRD's printer columns (what ``kubectl get`` shows);
* :meth:`ClusterEmulator.create_after_next_list`: objects created just after the next LIST of a
  resource is taken, before it is answered (what a busy cluster does between a client's calls).

It runs in its own thread with its own event loop (:class:`EmulatorThread`).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import celpy
import jsonpatch
import jsonschema

from bucketq.operator.manifests import typed  # the CEL typing `make check-manifests` uses
from tests.operator.kmock_adapter import (
    EmulatorBase,
    Request,
    Resource,
    ResourceInfo,
    Server,
    aiohttp_request,
)

Key = tuple[Resource, str | None, str]
VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}
BUILTINS: dict[str, dict[str, Any]] = {
    "v1/namespaces": {"kind": "Namespace", "singular": "namespace", "namespaced": False},
    "v1/pods": {"kind": "Pod", "singular": "pod", "namespaced": True},
    "v1/events": {"kind": "Event", "singular": "event", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "singular": "secret", "namespaced": True},
    "apps/v1/deployments": {
        "kind": "Deployment",
        "singular": "deployment",
        "namespaced": True,
        "subresources": {"status"},
    },
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "singular": "customresourcedefinition",
        "namespaced": False,
        "shortnames": {"crd", "crds"},
        "subresources": {"status"},
    },
    # the operators' leader election (bucketq/operator/leader.py)
    "coordination.k8s.io/v1/leases": {"kind": "Lease", "singular": "lease", "namespaced": True},
    "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations": {
        "kind": "MutatingWebhookConfiguration",
        "singular": "mutatingwebhookconfiguration",
        "namespaced": False,
    },
}
NAMESPACES_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


class ApiError(Exception):
    """A Kubernetes ``Status`` failure."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass
class CustomKind:
    """What the emulator knows of a custom resource kind (from its CRD)."""

    kind: str
    group: str
    version: str
    plural: str
    schema: dict[str, Any]
    status_subresource: bool
    columns: list[dict[str, Any]] = field(default_factory=list)


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting, top-down: a defaulted object gets its own nested defaults too."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def prune(schema: dict[str, Any], value: Any, path: str, unknown: list[str]) -> Any:
    """Drop fields the schema does not know (recording them), as the apiserver does."""
    if (
        isinstance(value, dict)
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        for name in list(value):
            if name not in schema["properties"]:
                unknown.append(f"{path}.{name}".lstrip("."))
                del value[name]
            else:
                value[name] = prune(schema["properties"][name], value[name], f"{path}.{name}", unknown)
    elif isinstance(value, list) and "items" in schema:
        return [prune(schema["items"], v, f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


class CelRules:
    """Evaluates ``x-kubernetes-validations`` rules (transition rules only on updates)."""

    def __init__(self) -> None:
        self.env = celpy.Environment()
        self.programs: dict[str, Any] = {}

    def errors(self, schema: dict[str, Any], new: Any, old: Any, path: str) -> Iterator[str]:
        for rule in schema.get("x-kubernetes-validations", ()):
            if "oldSelf" in rule["rule"] and old is None:
                continue
            if rule["rule"] not in self.programs:
                self.programs[rule["rule"]] = self.env.program(self.env.compile(rule["rule"]))
            activation = {"self": celpy.json_to_cel(typed(schema, new))}
            if old is not None:
                activation["oldSelf"] = celpy.json_to_cel(typed(schema, old))
            try:
                ok = bool(self.programs[rule["rule"]].evaluate(activation))
            except Exception as exc:  # an evaluation error fails the rule, as in Kubernetes
                ok, rule = False, {**rule, "message": f"{rule.get('message', rule['rule'])} ({exc})"}
            if not ok:
                yield f"{path or '<root>'}: Invalid value: {rule.get('message') or 'failed rule: ' + rule['rule']}"
        if isinstance(new, dict):
            for name, sub in schema.get("properties", {}).items():
                if name in new:
                    old_sub = old.get(name) if isinstance(old, dict) else None
                    yield from self.errors(sub, new[name], old_sub, f"{path}.{name}".lstrip("."))
        elif isinstance(new, list) and "items" in schema:
            for i, item in enumerate(new):
                yield from self.errors(schema["items"], item, None, f"{path}[{i}]")


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# A field, optionally with a filter on a list of objects: ``conditions[?(@.type=="Ready")]``.
_PATH_STEP = re.compile(
    r'(?P<field>[A-Za-z0-9_-]+)(?:\[\?\(@\.(?P<key>[A-Za-z0-9_-]+)=="(?P<value>[^"]*)"\)\])?'
)


def json_path(obj: Any, path: str) -> Any:
    """The printer-column JSONPath subset: dotted fields and equality filters on lists.

    A filter selects the first matching list item, as the apiserver's table printer shows the
    first result of a path. Anything else in a path is an error (so that a column the emulator
    cannot evaluate fails a test instead of showing nothing).
    """
    steps = re.findall(r"[^.\[]+(?:\[[^\]]*\])?", path.strip("."))
    for step in steps:
        match = _PATH_STEP.fullmatch(step)
        if match is None:
            raise ValueError(f"unsupported JSONPath step {step!r} in {path!r}")
        if not isinstance(obj, dict) or match["field"] not in obj:
            return None
        obj = obj[match["field"]]
        if match["key"] is not None:
            found = [i for i in obj or () if isinstance(i, dict) and i.get(match["key"]) == match["value"]]
            if not found:
                return None
            obj = found[0]
    return obj


@attrs.define(kw_only=True)
class ClusterEmulator(EmulatorBase):
    """kmock's Kubernetes emulator with the API semantics kopf and kubectl rely on."""

    _store: dict[Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _log: list[tuple[int, Resource, str | None, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _rv: int = attrs.field(default=1, init=False)
    _cond: asyncio.Condition | None = attrs.field(default=None, init=False)
    _custom: dict[Resource, CustomKind] = attrs.field(factory=dict, init=False)
    _cel: CelRules = attrs.field(factory=CelRules, init=False)
    # plural -> bodies to create right after the next LIST of that resource (one-shot)
    _after_next_list: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in BUILTINS.items():
            self.resources[key] = ResourceInfo(verbs=VERBS, **info)

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def changed(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def _info(self, res: Resource) -> ResourceInfo:
        for known in self.resources:
            if known == res:
                return self.resources[known]  # type: ignore[return-value]
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({res.plural})")

    async def _event(self, res: Resource, kind: str, obj: dict[str, Any]) -> None:
        self._log.append((self._rv, res, kind, copy.deepcopy(obj)))
        async with self.changed:
            self.changed.notify_all()

    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock cannot parse paths of the cluster-scoped ``namespaces`` resource: parse those here."""
        match = NAMESPACES_PATH.match(raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        request = self.record_request(
            raw_request,
            await raw_request.read(),
            resource=Resource("", "v1", "namespaces"),
            name=match["name"],
            subresource=match["sub"],
        )
        return await self.handle(request)

    async def handle(self, request: Request) -> aiohttp.web.StreamResponse:
        if request.resource is None or request.resource.plural is None:
            return await super().handle(request)  # discovery: kmock's own
        try:
            return await self._serve(request)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)

    async def _serve(self, req: Request) -> aiohttp.web.StreamResponse:
        res = Resource(req.resource.group, req.resource.version, req.resource.plural)  # type: ignore[union-attr]
        info = self._info(res)
        namespace = req.namespace if info.namespaced else None
        method = req.method.value if hasattr(req.method, "value") else str(req.method)
        body: Any = json.loads(req.body) if req.body else None
        if method == "GET" and req.params.get("watch") in ("true", "1"):
            return await self._watch(req, res, namespace)
        if method == "GET" and req.name is None:
            listing = self._list(res, namespace)
            for obj in self._after_next_list.pop(res.plural or "", []):
                await self._insert(res, namespace if info.namespaced else None, obj)
            return self._respond(req, res, listing)
        if method == "GET":
            return self._respond(req, res, self._get(res, namespace, req.name))
        if method == "POST" and req.name is None:
            obj = await self._create(req, res, info, namespace, body)
            return aiohttp.web.json_response(obj, status=201)
        if method in ("PATCH", "PUT") and req.name is not None:
            ctype = req.headers.get("Content-Type", "application/json").split(";")[0].strip()
            return aiohttp.web.json_response(
                await self._update(
                    req, res, namespace, req.name, req.subresource, ctype, body, method == "PUT"
                )
            )
        if method == "DELETE" and req.name is not None:
            return aiohttp.web.json_response(await self._delete(res, namespace, req.name))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {req.url.path}")

    async def resource_list(self, request: Request) -> Any:
        """kmock's APIResourceList, with subresources as the apiserver lists them (no names, no categories)."""
        listing = await super().resource_list(request)
        for entry in listing.get("resources", []):
            if "/" in entry["name"]:
                entry.update(shortNames=[], categories=[], verbs=["get", "patch", "update"])
            else:
                entry["verbs"] = sorted(entry["verbs"])
        return listing

    # -- reading ---------------------------------------------------------------------------------

    def _get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._store.get((res, namespace, name))
        if obj is None:
            group = f".{res.group}" if res.group else ""
            raise ApiError(404, "NotFound", f'{res.plural}{group} "{name}" not found')
        return copy.deepcopy(obj)

    def _list(self, res: Resource, namespace: str | None) -> dict[str, Any]:
        items = [
            copy.deepcopy(o)
            for (r, ns, _), o in sorted(self._store.items(), key=lambda kv: (kv[0][1] or "", kv[0][2]))
            if r == res and (namespace is None or ns == namespace)
        ]
        kind = self._info(res).kind or "Object"
        return {
            "apiVersion": self._api_version(res),
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    @staticmethod
    def _api_version(res: Resource) -> str:
        return f"{res.group}/{res.version}" if res.group else str(res.version)

    def _respond(self, req: Request, res: Resource, payload: dict[str, Any]) -> aiohttp.web.Response:
        if "as=Table" in req.headers.get("Accept", ""):
            items = payload.get("items", [payload])
            return aiohttp.web.json_response(self._table(res, items))
        return aiohttp.web.json_response(payload)

    def _table(self, res: Resource, items: list[dict[str, Any]]) -> dict[str, Any]:
        custom = self._custom.get(res)
        columns = [
            c for c in (custom.columns if custom else []) if c["jsonPath"] != ".metadata.creationTimestamp"
        ]
        definitions = [
            {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}
        ]
        definitions += [
            {
                "name": c["name"],
                "type": c["type"],
                "format": "",
                "description": c.get("description", ""),
                "priority": c.get("priority", 0),
            }
            for c in columns
        ]
        definitions.append(
            {"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0}
        )
        rows = []
        for obj in items:
            cells: list[Any] = [obj["metadata"]["name"]]
            for c in columns:
                value = json_path(obj, c["jsonPath"])
                cells.append(
                    json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else value
                )
            cells.append(age(obj["metadata"].get("creationTimestamp")))
            meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
            rows.append(
                {
                    "cells": cells,
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": meta,
                    },
                }
            )
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "columnDefinitions": definitions,
            "rows": rows,
        }

    async def _watch(self, req: Request, res: Resource, namespace: str | None) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(aiohttp_request(req))
        since = req.params.get("resourceVersion") or ""
        deadline = time.monotonic() + float(req.params.get("timeoutSeconds") or 3600)

        async def send(event: dict[str, Any]) -> None:
            await response.write(json.dumps(event).encode() + b"\n")

        if since in ("", "0") or req.params.get("sendInitialEvents") == "true":
            index = len(self._log)
            position = self._rv
            for obj in self._list(res, namespace)["items"]:
                await send({"type": "ADDED", "object": obj})
            if req.params.get("sendInitialEvents") == "true":
                await send(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": self._info(res).kind,
                            "apiVersion": self._api_version(res),
                            "metadata": {
                                "resourceVersion": str(position),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                )
        else:
            index = next((i for i, entry in enumerate(self._log) if entry[0] > int(since)), len(self._log))
        try:
            while True:
                while index < len(self._log):
                    _, r, kind, obj = self._log[index]
                    index += 1
                    if r == res and (namespace is None or obj["metadata"].get("namespace") == namespace):
                        await send({"type": kind, "object": obj})
                async with self.changed:
                    if index < len(self._log):
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        await asyncio.wait_for(self.changed.wait(), timeout=remaining)
                    except TimeoutError:
                        break
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return response
        await response.write_eof()
        return response

    # -- writing ---------------------------------------------------------------------------------

    def _validate(
        self,
        req: Request | None,
        res: Resource,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
    ) -> None:
        custom = self._custom.get(res)
        if custom is None:
            return
        schema = custom.schema
        unknown: list[str] = []
        for part in ("spec", "status"):
            if part in obj and part in schema.get("properties", {}):
                obj[part] = prune(schema["properties"][part], obj[part], part, unknown)
        for extra in [k for k in obj if k not in schema.get("properties", {})]:
            unknown.append(extra)
            del obj[extra]
        if unknown and req is not None and req.params.get("fieldValidation") == "Strict":
            raise ApiError(
                400,
                "BadRequest",
                "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown),
            )
        apply_defaults(schema, obj)
        name = obj["metadata"].get("name", "")
        problems = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
        ]
        problems += list(self._cel.errors(schema, obj, old, ""))
        if problems:
            raise ApiError(
                422, "Invalid", f'{custom.kind}.{custom.group} "{name}" is invalid: ' + "; ".join(problems)
            )

    def create_after_next_list(self, plural: str, *bodies: dict[str, Any]) -> None:
        """Create ``bodies`` just after the next LIST of ``plural`` is taken, before it is answered:
        the list misses them and a watch from its resourceVersion sees them (called from any thread:
        the next LIST, on the emulator's loop, takes them)."""
        self._after_next_list[plural] = [copy.deepcopy(b) for b in bodies]

    async def _insert(self, res: Resource, namespace: str | None, body: dict[str, Any]) -> None:
        """Store a new object as a create would (no admission: the test's own objects)."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=now_iso())
        await self._add(res, obj)

    async def _create(
        self,
        req: Request,
        res: Resource,
        info: ResourceInfo,
        namespace: str | None,
        body: Any,
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a create must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422, "Invalid", "metadata.name: Required value: name or generateName is required"
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if info.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        key = (res, meta.get("namespace"), meta["name"])
        if key in self._store:
            raise ApiError(409, "AlreadyExists", f'{res.plural} "{meta["name"]}" already exists')
        custom = self._custom.get(res)
        if custom is not None and custom.status_subresource:
            obj.pop("status", None)
        self._validate(req, res, obj, None)
        meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=now_iso())
        if req.params.get("dryRun"):
            return obj
        await self._add(res, obj)
        return copy.deepcopy(obj)

    async def _add(self, res: Resource, obj: dict[str, Any]) -> None:
        """Store a new object (stamped with its uid) and announce it: how every create ends."""
        meta = obj["metadata"]
        self._bump(obj)
        self._store[(res, meta.get("namespace"), meta["name"])] = obj
        if res == CRDS:
            self._register(obj)
        await self._event(res, "ADDED", obj)

    async def _update(
        self,
        req: Request,
        res: Resource,
        namespace: str | None,
        name: str,
        subresource: str | None,
        ctype: str,
        body: Any,
        replace: bool,
    ) -> dict[str, Any]:
        old = self._get(res, namespace, name)
        if replace or ctype == "application/json":
            new = copy.deepcopy(body)
        elif ctype == "application/json-patch+json":
            try:
                new = jsonpatch.apply_patch(old, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the JSON patch cannot be applied: {exc}") from None
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            sent_rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if sent_rv is not None and sent_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.plural} "{name}": '
                    "the object has been modified; please apply your changes again",
                )
            new = merge_patch(old, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the patch type {ctype} is not supported")
        if replace:
            sent_rv = (new.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}"')
        custom = self._custom.get(res)
        has_status = custom.status_subresource if custom else "status" in (self._info(res).subresources or ())
        if subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            if has_status:
                if "status" in old:
                    result["status"] = old["status"]
                else:
                    result.pop("status", None)
            meta = result.setdefault("metadata", {})
            for fixed in ("uid", "creationTimestamp", "generation", "namespace", "name", "deletionTimestamp"):
                if fixed in old["metadata"]:
                    meta[fixed] = old["metadata"][fixed]
                else:
                    meta.pop(fixed, None)
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        self._validate(req, res, result, old)
        essence = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        if essence(result) != essence(old):
            result["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if result == old:
            return old
        if req.params.get("dryRun"):
            return result
        self._bump(result)
        key = (res, namespace, name)
        self._store[key] = result
        if res == CRDS:
            self._register(result)
        if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers"):
            del self._store[key]
            self._bump(result)
            await self._event(res, "DELETED", result)
        else:
            await self._event(res, "MODIFIED", result)
        return copy.deepcopy(result)

    async def _delete(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._get(res, namespace, name)
        key = (res, namespace, name)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = now_iso()
                obj["metadata"]["deletionGracePeriodSeconds"] = 0
                self._bump(obj)
                self._store[key] = obj
                await self._event(res, "MODIFIED", obj)
            return obj
        del self._store[key]
        self._bump(obj)
        await self._event(res, "DELETED", obj)
        return obj

    def _register(self, crd: dict[str, Any]) -> None:
        """Serve the custom resource a CRD defines (discovery, validation, printer columns)."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = Resource(spec["group"], version["name"], names["plural"])
            subresources = set(version.get("subresources") or {})
            self.resources[res] = ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=VERBS,
                shortnames=set(names.get("shortNames") or ()),
                categories=set(names.get("categories") or ()),
                subresources=subresources,
            )
            self._custom[res] = CustomKind(
                names["kind"],
                spec["group"],
                version["name"],
                names["plural"],
                version["schema"]["openAPIV3Schema"],
                "status" in subresources,
                list(version.get("additionalPrinterColumns") or []),
            )


class EmulatorThread:
    """The emulator served on 127.0.0.1 from a thread with its own event loop."""

    def __init__(self) -> None:
        self.emulator: ClusterEmulator | None = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="k8s-emulator", daemon=True)

    def start(self) -> EmulatorThread:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the Kubernetes emulator did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator failed to start: {self._error!r}")
        return self

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with ClusterEmulator() as emulator, Server(emulator) as server:
                self.emulator = emulator
                self.url = str(server.url).rstrip("/")
                self._started.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            self._started.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=15)
