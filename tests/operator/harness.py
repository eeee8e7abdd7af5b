"""Test harness: a small Kubernetes client, bounded waits, and operators running in threads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.crds import all_crds
from bucketq.operator.handlers import Operator
from bucketq.operator.runner import LoginFn, serve
from tests.operator.k8s_emulator import EmulatorThread

T = TypeVar("T")

RESOURCES: dict[str, tuple[str, bool]] = {
    "topics": ("bucketq.io/v1alpha1", True),
    "consumers": ("bucketq.io/v1alpha1", True),
    "deadletterpolicies": ("bucketq.io/v1alpha1", True),
    "namespaces": ("v1", False),
    "pods": ("v1", True),
    "events": ("v1", True),
    "mutatingwebhookconfigurations": ("admissionregistration.k8s.io/v1", False),
    "customresourcedefinitions": ("apiextensions.k8s.io/v1", False),
    "leases": ("coordination.k8s.io/v1", True),
}
PLURALS = {
    "Topic": "topics",
    "Consumer": "consumers",
    "DeadLetterPolicy": "deadletterpolicies",
    "Namespace": "namespaces",
    "Pod": "pods",
    "CustomResourceDefinition": "customresourcedefinitions",
}


class ApiFailure(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('message', body)}")
        self.status = status
        self.body = body


class Kube:
    """Just enough of a Kubernetes client for the tests (JSON over urllib)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def path(
        self, plural: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
    ) -> str:
        api_version, namespaced = RESOURCES[plural]
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        if namespaced and namespace:
            base += f"/namespaces/{namespace}"
        parts = [base, plural, name, sub]
        return "/".join(p for p in parts if p)

    def request(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": ctype}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ApiFailure(exc.code, json.loads(exc.read() or b"{}")) from None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        plural = PLURALS[obj["kind"]]
        namespace = obj.get("metadata", {}).get("namespace")
        return dict(self.request("POST", self.path(plural, namespace), obj))

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.request("GET", self.path(plural, namespace, name)))
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, plural: str, namespace: str | None, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.request("PATCH", self.path(plural, namespace, name), patch, "application/merge-patch+json")
        )

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return list(self.request("GET", self.path(plural, namespace))["items"])

    def delete(self, plural: str, namespace: str | None, name: str) -> None:
        self.request("DELETE", self.path(plural, namespace, name))

    def namespace(self, prefix: str) -> str:
        """Create a namespace with a unique name starting with ``prefix``."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name


def wait_for(check: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy (AssertionErrors count as not yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cond["type"] == type_:
            return dict(cond)
    return {}


def login_to(url: str) -> Callable[..., kopf.ConnectionInfo]:
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, insecure=True)

    return login


@contextlib.contextmanager
def running_emulator() -> Iterator[EmulatorThread]:
    """An emulated API server of its own, with the generated CRDs installed."""
    thread = EmulatorThread().start()
    kube = Kube(thread.url)
    for crd in all_crds():
        kube.create(crd)
    try:
        yield thread
    finally:
        thread.stop()


def fast_settings(namespaces: list[str], **overrides: Any) -> OperatorSettings:
    """Operator settings for tests: fast refresh, short retries, no webhook, no liveness port."""
    values: dict[str, Any] = {
        "namespaces": namespaces,
        "status_interval_s": 1.0,
        "gc_interval_s": 3600.0,
        "retry_min_s": 0.3,
        "retry_max_s": 2.0,
        # a namespace created while the operator starts is missed by kopf's watch (namespace_resync)
        "namespace_resync_s": 2.0,
        "liveness_port": 0,
        "metrics_port": 0,
        "webhook": False,
        # the store checks write under the root: tests that compare the bucket's objects before
        # and after turn them off (tests/operator/test_store_checks.py runs them)
        "store_checks": False,
    }
    values.update(overrides)
    return OperatorSettings(**values)


def in_thread(
    operator: Operator, *, login: LoginFn | None = None
) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """Start ``operator`` in a daemon thread with its own event loop; returns (thread, stop, ready)."""
    stop, ready = threading.Event(), threading.Event()

    def main() -> None:
        asyncio.run(serve(operator, login=login, stop_flag=stop, ready_flag=ready))

    thread = threading.Thread(target=main, name="bucketq-operator", daemon=True)
    thread.start()
    return thread, stop, ready


@dataclass
class RunningOperator:
    """An operator running in its own thread against the emulator."""

    operator: Operator
    url: str
    thread: Any = None
    stop_flag: Any = None
    ready: Any = None
    stopped: bool = field(default=False)

    def start(self, timeout: float = 30.0) -> RunningOperator:
        self.thread, self.stop_flag, self.ready = in_thread(self.operator, login=login_to(self.url))
        if not self.ready.wait(timeout):
            self.stop()
            raise AssertionError(f"the operator was not ready within {timeout:g}s")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self.stopped or self.thread is None:
            return
        self.stopped = True
        self.stop_flag.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"the operator did not stop within {timeout:g}s")


def start_operator(url: str, engine: Settings, settings: OperatorSettings) -> RunningOperator:
    return RunningOperator(Operator(engine, settings), url).start()


async def eventually(check: Callable[[], Awaitable[T | None]], what: str, timeout: float = 60.0) -> T:
    """Await ``check`` until it returns something truthy; the event loop keeps running meanwhile
    (the async twin of :func:`wait_for`)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = await check()
            if result:
                return result
            last = result
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last seen: {last!r}")
        await asyncio.sleep(0.1)
