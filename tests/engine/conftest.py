"""Fixtures of the engine tests: ``backend`` (every store the engine runs on), ``stored_backend``
(those but the in-memory store, for tests whose in-memory case runs on the virtual clock),
``race_backend`` (stores whose put-if-absent is atomic under concurrency) and ``gc_backend`` (the
in-memory store and a moto server: what garbage collection tests run on)."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.engine_helpers import Backend, _backend_for, backend, race_backend, stored_backend

__all__ = ["backend", "gc_backend", "race_backend", "stored_backend"]


@pytest.fixture(params=["memory", pytest.param("moto", marks=pytest.mark.s3)])
async def gc_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    b = _backend_for(request.param, request, tmp_path)
    yield b
    await b.close_all()
