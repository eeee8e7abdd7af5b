"""Reading one object straight from the Kubernetes API server, with the operator's credentials.

The webhook answers from a watch-fed index, which trails the API server: a webhook replica that
serves namespaces by pattern starts watching a new namespace only after it sees the namespace, and
a busy API server delivers events late. Before it refuses a pod for a Consumer it has not seen, the
webhook asks the API server itself (``SidecarInjector``), so that lag costs a short wait, never a
refused pod.

kopf gives handlers no public call to read an object. Its own client
(``kopf._cogs.clients.api``) carries the credentials of the operator's login handlers and is what
kopf reads and patches with; the settings come from the context kopf sets for every task it runs.
kopf is pinned (``>=1.45.2,<1.46``) and ``tests/operator/test_webhook.py`` exercises this read
against the API emulator, so a kopf release that moves these names fails the tests first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors
from kopf._core.engines import posting

log = logging.getLogger("bucketq.operator")


class ApiReadError(Exception):
    """The API server could not be asked or did not answer (not a 404: that is ``None``)."""


async def read_namespaced(
    group: str, version: str, plural: str, namespace: str, name: str, *, timeout_s: float
) -> dict[str, Any] | None:
    """GET one namespaced custom resource: its body, or None when the API server has no such object.

    One attempt, bounded by ``timeout_s`` (an admission review has its own deadline).

    Raises:
        ApiReadError: outside a running operator, a refused request (401, 403: the role lacks
            ``get``), a server error, or no answer within ``timeout_s``.
    """
    try:
        settings = posting.settings_var.get()
    except LookupError:
        raise ApiReadError("no running operator in this context") from None
    url = f"/apis/{group}/{version}/namespaces/{quote(namespace)}/{plural}/{quote(name)}"
    try:
        async with asyncio.timeout(timeout_s):
            response = await kopf_api.request("get", url, settings=settings, backoffs=[], logger=log)
            async with response:
                body = await response.json()
    except kopf_errors.APINotFoundError:
        return None
    except Exception as exc:  # API errors, timeouts, aiohttp's and JSON's: the caller decides
        raise ApiReadError(f"GET {url}: {exc!r}") from exc
    if not isinstance(body, dict):
        raise ApiReadError(f"GET {url}: not an object: {type(body).__name__}")
    return body
