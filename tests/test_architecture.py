"""What import-linter (``make lint``, [tool.importlinter] in pyproject.toml) cannot say about the
layering: a package uses another package's public names only.

The contracts there decide which package may import which; this test decides *what* it may take.
A ``_name`` is its module's own: another package that imports it (the demo once took the bench's
``_die_with_parent``) ties itself to a detail that may change without notice.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bucketq

PACKAGE = Path(bucketq.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


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


def test_the_where_is_table_names_modules_and_functions_that_exist() -> None:
    """docs/architecture.md answers each question with a module (and often a function or class in
    it): a rename that leaves the table pointing nowhere fails here."""
    text = ARCHITECTURE.read_text()
    rows = [
        line
        for line in text[text.index("## Where is") :].splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert len(rows) > 20, "the table could not be read"
    missing = []
    for row in rows[1:]:  # rows[0] is the header
        names = re.findall(r"`([^`]+)`", row)
        files = [
            PACKAGE.parent / (n if n.startswith("bucketq/") else f"bucketq/{n}")
            for n in names
            if n.endswith(".py")
        ]
        missing += [str(f) for f in files if not f.is_file()]
        sources = "\n".join(f.read_text() for f in files if f.is_file())
        for name in (n for n in names if not n.endswith(".py")):
            leaf = name.split(".")[-1]
            if not re.search(rf"^\s*(async def|def|class) {leaf}\b", sources, flags=re.M):
                missing.append(f"{name} (in {[f.name for f in files]})")
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
