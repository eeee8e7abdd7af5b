"""What the tests need beyond ``.venv``, and the one way to do without it.

Green must mean "ran": a test whose tool is missing FAILS, naming the tool and how to install it
(``make tools`` installs helm and kubectl into ``.tools/bin``, Debian's ``prometheus`` and a Java
runtime; ``make venv`` the spark extra). A machine that truly cannot have a tool opts out of its
area explicitly, with one environment variable::

    BUCKETQ_TEST_SKIP=spark,helm pytest

Then the area's tests are skipped, but only when the tool is actually missing (where it exists they
run), and the terminal summary lists the areas skipped that way (``tests/conftest.py``).

Areas (:data:`AREAS`): ``spark`` (pyspark, pyarrow and Java), ``helm``, ``kubectl``, ``prometheus``
(``promtool`` and ``prometheus``) and ``kind`` (Docker and kind for the kind e2e test, which runs
only when asked for with ``BUCKETQ_E2E_KIND=1``, as ``make e2e`` does).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

SKIP_ENV = "BUCKETQ_TEST_SKIP"
AREAS = {
    "spark": "pyspark and pyarrow (the spark extra) and a Java runtime",
    "helm": "the helm binary",
    "kubectl": "the kubectl binary",
    "prometheus": "promtool and prometheus",
    "kind": "Docker and kind (the kind e2e, with BUCKETQ_E2E_KIND=1)",
}
# Every skip of an opted-out area starts with this, so the terminal summary can count them.
SKIP_PREFIX = f"{SKIP_ENV}="
TOOLS_BIN = Path(__file__).resolve().parents[2] / ".tools" / "bin"
MAKE_TOOLS = "run `make tools`"


def opted_out() -> set[str]:
    """The areas named in ``BUCKETQ_TEST_SKIP``; an unknown name is a usage error (a typo skips nothing)."""
    names = {n.strip() for n in os.environ.get(SKIP_ENV, "").split(",") if n.strip()}
    unknown = names - AREAS.keys()
    if unknown:
        raise pytest.UsageError(
            f"{SKIP_ENV}: unknown area(s) {', '.join(sorted(unknown))}; known: {', '.join(AREAS)}"
        )
    return names


def missing(area: str, what: str, install: str) -> NoReturn:
    """Fail the current test because ``what`` is missing, or skip it when ``area`` is opted out."""
    assert area in AREAS, area
    if area in opted_out():
        pytest.skip(f"{SKIP_PREFIX}{area}: {what} is not installed")
    pytest.fail(
        f"{what} is not installed: {install}. A machine that cannot have it: {SKIP_ENV}={area} "
        "skips these tests instead.",
        pytrace=False,
    )


def binary(name: str, area: str, install: str = MAKE_TOOLS) -> str:
    """The path of ``name``: from ``make tools`` (.tools/bin), else from PATH; else :func:`missing`."""
    local = TOOLS_BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        missing(area, name, install)
    return found


def kubectl() -> str:
    return binary("kubectl", "kubectl")


def helm() -> str:
    return binary("helm", "helm")


def promtool() -> str:
    return binary("promtool", "prometheus", f"{MAKE_TOOLS} (Debian package prometheus)")


def prometheus() -> str:
    return binary("prometheus", "prometheus", f"{MAKE_TOOLS} (Debian package prometheus)")


def spark_missing() -> tuple[str, str] | None:
    """What the Spark tests lack and how to install it (pyspark, pyarrow, java), or None: they can run."""
    try:
        import pyarrow  # noqa: F401
        import pyspark.sql.datasource  # noqa: F401
    except Exception as exc:  # missing, or a broken install
        return f"the spark extra ({exc})", "run `make venv` (it installs .[dev,spark])"
    if shutil.which("java") is None:
        return "java", f"{MAKE_TOOLS} (Debian package default-jre-headless), or install any Java 17+ runtime"
    return None


class MissingToolModule(pytest.File):
    """Stands in for a test module that cannot even be imported without its tool: one item that
    fails (or skips, when the area is opted out), so the module never just vanishes from the run."""

    area: str
    what: str
    install: str

    def collect(self) -> Iterator[pytest.Item]:
        yield MissingToolItem.from_parent(self, name=f"needs-{self.area}")


class MissingToolItem(pytest.Item):
    def runtest(self) -> None:
        module: Any = self.parent
        missing(module.area, module.what, module.install)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name
