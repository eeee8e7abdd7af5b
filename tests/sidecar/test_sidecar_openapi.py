"""openapi/sidecar.yaml is current and describes exactly the routes the sidecar serves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from bucketq.config import Settings
from bucketq.sidecar.config import SidecarConfig, SidecarSettings
from bucketq.sidecar.openapi import render
from bucketq.sidecar.process import Sidecar

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "sidecar.yaml"
DOC = Path(__file__).resolve().parents[2] / "docs" / "sidecar-api.md"


def test_checked_in_file_is_generated_from_the_models() -> None:
    assert SPEC.read_text() == render(), "run: python -m bucketq.sidecar.openapi > openapi/sidecar.yaml"


async def test_spec_paths_match_the_server_routes() -> None:
    from bucketq.sidecar.server import build_api_app

    config = SidecarConfig(SidecarSettings(), Settings.from_dict({"backend": "memory"}))
    app = build_api_app(Sidecar(config).api, token=None)
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    spec = yaml.safe_load(SPEC.read_text())
    documented = {(method, path) for path, ops in spec["paths"].items() for method in ops}
    assert served == documented


def _documented_statuses() -> dict[int, set[str]]:
    """status -> error codes, from the error table of docs/sidecar-api.md."""
    table: dict[int, set[str]] = {}
    section = DOC.read_text().split("## Errors", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            table.setdefault(int(cells[0]), set()).update(re.findall(r"`([a-z_]+)`", cells[1]))
    return table


async def test_a_wrong_method_answers_405_as_documented() -> None:
    """Every path, asked with a method it does not take: 405 ``method_not_allowed`` as JSON with the
    ``Allow`` header RFC 9110 requires; the docs' error table and the spec document it."""
    from aiohttp.test_utils import TestClient, TestServer

    from bucketq.sidecar.server import build_api_app

    config = SidecarConfig(SidecarSettings(), Settings.from_dict({"backend": "memory"}))
    app = build_api_app(Sidecar(config).api, token=None)
    spec = yaml.safe_load(SPEC.read_text())
    async with TestClient(TestServer(app)) as client:
        for path, ops in spec["paths"].items():
            (method,) = ops
            wrong = "GET" if method == "post" else "POST"
            url = path.replace("{topic}", "orders")
            async with client.request(wrong, url) as resp:
                assert resp.status == 405, (wrong, url, resp.status)
                body = await resp.json()
                assert body["error"] == "method_not_allowed" and wrong in body["message"], body
                assert method.upper() in resp.headers["Allow"], resp.headers
    assert "method_not_allowed" in _documented_statuses()[405]
    assert "Allow" in spec["components"]["responses"]["E405"]["headers"]
    assert set(spec["components"]["responses"]) == {f"E{code}" for code in _documented_statuses()}
