"""What import-linter (``make lint``, [tool.importlinter] in pyproject.toml) cannot say about the
layering: a package uses another package's public names only.

The contracts there decide which package may import which; this test decides *what* it may take.
A ``_name`` is its module's own: another package that imports it (the demo once took the bench's
``_die_with_parent``) ties itself to a detail that may change without notice.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bucketq

PACKAGE = Path(bucketq.__file__).parent


def _top(module: str) -> str:
    """``bucketq.bench.servers`` -> ``bench``; the root package's own modules are ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def _private_imports(source: str, module: str) -> list[str]:
    """The ``_names`` that ``module`` (its code: ``source``) imports from another bucketq package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("bucketq.")
            and _top(node.module) != _top(module)
        ):
            found += [f"{module}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_package_imports_another_packages_private_names() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found += _private_imports(path.read_text(), module)
    assert not found, f"private names imported across packages: {found}"


def test_the_check_sees_a_private_import() -> None:
    """The demo's old import is found; a package's own private names are not (a check that cannot
    fail proves nothing)."""
    line = "from bucketq.bench.servers import _die_with_parent, serve\n"
    assert _private_imports(line, "bucketq.demo.processes") == [
        "bucketq.demo.processes: bucketq.bench.servers._die_with_parent"
    ]
    assert _private_imports(line, "bucketq.bench.sidecar") == []
