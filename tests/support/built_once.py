"""Something costly that every xdist worker needs, built by the first worker that asks and reused
by the others (the pattern pytest-xdist documents for session fixtures, with ``fcntl`` locks).

``built_once(factory, "name", build)`` returns a directory under the run's shared base temp
directory (the parent of every worker's own): the first caller runs ``build(directory)`` while
holding an exclusive lock on ``name.lock``; callers that arrive meanwhile wait on the lock (they
use no CPU), then find the ``name.done`` marker and reuse the directory. A build that raises leaves
no marker, so the next caller builds again and sees the same failure in its own test.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    base = factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent  # shared by the workers of one run (each has its own basetemp below it)
    target, done, lock = base / name, base / f"{name}.done", base / f"{name}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)  # what a failed build left
            target.mkdir(parents=True)
            build(target)
            done.touch()
    return target
