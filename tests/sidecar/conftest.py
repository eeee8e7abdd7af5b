"""Fixtures of the sidecar tests: sidecar processes and topics on real S3 servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, SidecarProc, start_sidecar
from tests.support.servers import S3Server


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[SidecarFactory]:
    """``sidecars(settings, name, **BUCKETQ_SIDECAR_options)`` starts one; all are killed at the end."""
    started: list[SidecarProc] = []

    def start(settings: Settings, name: str = "sidecar", **options: Any) -> SidecarProc:
        sc = start_sidecar(tmp_path, settings, name, **options)
        started.append(sc)
        return sc

    yield start
    for sc in started:
        sc.stop()


@pytest.fixture
def moto_settings(moto_server: S3Server) -> Settings:
    """A fresh bucket on the shared moto server."""
    settings: Settings = moto_server.settings()
    return settings


@pytest.fixture
def seaweedfs_settings(seaweedfs_server: S3Server) -> Settings:
    """A fresh bucket on the shared SeaweedFS server: for members racing on the same objects
    (moto's conditional writes are not atomic under concurrency; SeaweedFS's are)."""
    settings: Settings = seaweedfs_server.settings()
    return settings
