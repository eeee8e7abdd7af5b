"""Each extra installed from the wheel into a fresh virtualenv, and what it promises imported.

The wheel is built once; each virtualenv (base, ``[sidecar]``, ``[operator]``) is made once per run and
filled from the package registries by uv (the same resolution from the same index as pip, in a
fraction of its time; its cache makes reruns quick). ``[spark]`` is not installed:
pyspark alone is a ~300 MB download that takes well over a minute, so for Spark the test checks only
that the wheel's metadata (``importlib.metadata.requires``) lists pyspark and pyarrow under the
``spark`` extra, and that the base install answers ``bucketq spark`` with the install hint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from uv import find_uv_bin

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
UV = find_uv_bin()
HEAVY = ("kopf", "botocore", "aioboto3", "pyspark", "prometheus_client", "cryptography")
# Prints the heavy third-party modules loaded after the imports given as argv[1:].
PROBE = (
    "import importlib, json, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
)


def _env() -> dict[str, str]:
    # Nothing from the test runner's own virtualenv or settings may leak into the fresh ones.
    drop = ("BUCKETQ_", "PYTHON", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)} | {"NO_COLOR": "1"}


def _run(*cmd: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def _ok(*cmd: str | Path, timeout: float = 600) -> str:
    result = _run(*cmd, timeout=timeout)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _ok(sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", dist, REPO)
    (built,) = dist.glob("bucketq-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``venv(extra)``: the bin directory of a virtualenv with ``bucketq[extra]`` ("" for the base)."""
    made: dict[str, Path] = {}

    def make(extra: str) -> Path:
        if extra not in made:
            root = tmp_path_factory.mktemp(f"venv-{extra or 'base'}")
            _ok(UV, "venv", "--quiet", "--python", sys.executable, root)
            target = f"bucketq[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
            _ok(UV, "pip", "install", "--quiet", "--python", root / "bin" / "python", target)
            made[extra] = root / "bin"
        return made[extra]

    return make


def test_wheel_ships_the_typing_marker(wheel: Path) -> None:
    """PEP 561: without ``py.typed`` in the installed package, users' type checkers ignore
    bucketq's hints (every call would be ``Any``)."""
    with zipfile.ZipFile(wheel) as built:
        assert "bucketq/py.typed" in built.namelist()


def _heavy(bin_dir: Path, *modules: str) -> list[str]:
    loaded: list[str] = json.loads(_ok(bin_dir / "python", "-c", PROBE, *modules))
    return loaded


def test_base_import_is_light(venv: Callable[[str], Path]) -> None:
    base = venv("")
    assert _heavy(base, "bucketq") == []
    assert _heavy(base, "bucketq.client") == []
    # The engine's S3 adapter is the one place the base install loads botocore, and only on demand.
    assert _heavy(base, "bucketq", "bucketq.storage.s3") == ["aioboto3", "botocore"]
    _ok(base / "bucketq", "--help")


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("sidecar", "sidecar"),
        ("run", "sidecar"),
        ("operator", "operator"),
        ("crds", "operator"),
        ("spark", "spark"),
    ],
)
def test_base_install_names_the_missing_extra(venv: Callable[[str], Path], command: str, extra: str) -> None:
    result = _run(venv("") / "bucketq", command, "--help")
    assert result.returncode != 0
    hint = f"bucketq {command} needs the {extra} extra: pip install 'bucketq[{extra}]'"
    assert result.stderr.strip() == hint


@pytest.mark.parametrize(
    ("package", "extra"), [("sidecar", "sidecar"), ("operator", "operator"), ("spark", "spark")]
)
def test_base_install_library_entry_points_raise_the_hint(
    venv: Callable[[str], Path], package: str, extra: str
) -> None:
    code = f"import bucketq.{package}"
    result = _run(venv("") / "python", "-c", code)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"bucketq._extras.MissingExtra: bucketq.{package} needs the {extra} extra: pip install 'bucketq[{extra}]'"
    )


def test_spark_extra_metadata_lists_pyspark_and_pyarrow(venv: Callable[[str], Path]) -> None:
    code = "import importlib.metadata, json; print(json.dumps(importlib.metadata.requires('bucketq')))"
    requires: list[str] = json.loads(_ok(venv("") / "python", "-c", code))
    spark = {
        req.name
        for req in map(Requirement, requires)
        if req.marker is not None
        and req.marker.evaluate({"extra": "spark"})
        and not req.marker.evaluate({"extra": ""})
    }
    assert {"pyspark", "pyarrow"} <= spark, requires


def test_sidecar_extra(venv: Callable[[str], Path]) -> None:
    sidecar = venv("sidecar")
    _ok(sidecar / "bucketq", "sidecar", "--help")
    assert "prometheus_client" in _heavy(sidecar, "bucketq.sidecar.process")
    # The extra adds the server; the client stays as light as in the base install.
    assert _heavy(sidecar, "bucketq.client") == []


def test_operator_extra(venv: Callable[[str], Path]) -> None:
    operator = venv("operator")
    _ok(operator / "bucketq", "operator", "--help")
    _ok(operator / "bucketq", "crds", "--help")
    assert {"kopf", "cryptography", "prometheus_client"} <= set(
        _heavy(operator, "bucketq.operator.runner", "bucketq.operator.certs")
    )
    assert _heavy(operator, "bucketq") == []
