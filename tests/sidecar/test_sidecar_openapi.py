"""openapi/sidecar.yaml is current and describes exactly the routes the sidecar serves."""

from __future__ import annotations

from pathlib import Path

import yaml

from bucketq.config import Settings
from bucketq.sidecar.config import SidecarConfig, SidecarSettings
from bucketq.sidecar.openapi import render
from bucketq.sidecar.process import Sidecar

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "sidecar.yaml"


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
