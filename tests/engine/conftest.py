"""Fixtures of the engine tests: ``backend`` (every store the engine runs on) and
``race_backend`` (stores whose put-if-absent is atomic under concurrency)."""

from tests.support.engine_helpers import backend, race_backend

__all__ = ["backend", "race_backend"]
