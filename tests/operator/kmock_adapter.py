"""The only module of the tests that touches kmock's internals; the emulator imports kmock through it.

kmock is pinned exactly (``kmock==0.8`` in pyproject's ``dev`` extra) because of this module: the
operator tests' Kubernetes emulator (``k8s_emulator.py``) extends ``kmock.KubernetesEmulator`` at
points kmock does not publish, and any kmock release may move them. What is internal here:

* ``kmock._internal.rendering.Request``: built by hand for the paths kmock cannot parse;
* ``Request._raw_request``: the aiohttp request behind a parsed one (:func:`aiohttp_request`);
* ``KubernetesEmulator._requests``: the request log every served request is appended to;
* ``KubernetesEmulator._handle``: the dispatch of a parsed request (overridden: :meth:`handle`);
* ``KubernetesScaffold._serve_version``: the discovery ``APIResourceList``
  (overridden: :meth:`EmulatorBase.resource_list`).

Upgrading kmock: bump the pin, run ``pytest tests/operator``, and fix what breaks here, not in the
emulator. Everything else the emulator uses is kmock's public API (re-exported below).
"""

from __future__ import annotations

from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

__all__ = ["EmulatorBase", "Request", "Resource", "ResourceInfo", "Server", "aiohttp_request"]

# kmock's public names, re-exported so that the emulator imports kmock from one place only.
Resource = kmock.resource  # a group/version/plural reference
ResourceInfo = kmock.ResourceInfo
Server = kmock.Server
# A parsed request (kmock.Request publishes the type, not its constructor's fields).
Request = rendering.Request


def aiohttp_request(request: Request) -> aiohttp.web.BaseRequest:
    """The aiohttp request a parsed request came from (a watch streams its answer on it)."""
    raw = request._raw_request
    assert raw is not None, "a request served over HTTP has its aiohttp request"
    return raw


@attrs.define(kw_only=True)
class EmulatorBase(kmock.KubernetesEmulator):
    """``kmock.KubernetesEmulator`` with its private hooks behind stable names.

    Subclasses override :meth:`handle` and :meth:`resource_list` (calling ``super()`` for kmock's
    own behaviour) and build requests for paths kmock cannot parse with :meth:`record_request`.
    """

    def record_request(
        self,
        raw_request: aiohttp.web.BaseRequest,
        body: bytes,
        *,
        resource: Resource,
        name: str | None = None,
        subresource: str | None = None,
    ) -> Request:
        """A parsed request made by hand, logged where kmock logs the requests it parses itself."""
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            body=body,
            text=body.decode(),
            resource=resource,
            name=name,
            subresource=subresource,
        )
        self._requests.append(request)
        return request

    async def handle(self, request: Request) -> aiohttp.web.StreamResponse:
        """Serve a parsed request; by default as kmock does (its reactions, then its emulation)."""
        return await super()._handle(request)

    async def resource_list(self, request: Request) -> Any:
        """The ``APIResourceList`` of a discovery request; by default kmock's."""
        return await super()._serve_version(request)

    # -- kmock's private hooks, routed to the names above -------------------------------------------

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        return await self.handle(request)

    async def _serve_version(self, request: Request) -> Any:
        return await self.resource_list(request)
