"""Every invariant of docs/protocol.md is traceable: a row of its table, a tag in the code that
enforces it, a tag in the tests, and the modules, tests and simulation properties its row names
exist.

An invariant is a paragraph ``**I<n> — ...**`` of the "Invariants" section; a tag is ``I<n>`` as a
word in a comment or docstring (``# I4``, ``(invariant I6)``). Adding an invariant means adding
its row, tagging the code that enforces it and the test that catches its violation; this test
says which is missing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.sim.checker import INVARIANTS as SIMULATION_PROPERTIES

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "docs" / "protocol.md"
TABLE_START = "<!-- invariant table:"
TABLE_END = "<!-- end of the invariant table -->"


def _invariants(text: str) -> list[str]:
    """The I-numbers the protocol defines, in order (``**I<n> — ...**`` paragraphs)."""
    return re.findall(r"^\*\*(I\d+) — ", text, flags=re.M)


def _table(text: str) -> dict[str, list[str]]:
    """Row label -> its cells (enforcing modules, regression tests, simulation properties)."""
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    rows: dict[str, list[str]] = {}
    for line in text[start:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("Invariant", "---"):
            continue
        label = re.match(r"I\d+\b", cells[0])
        rows[label.group(0) if label else cells[0]] = cells[1:]
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


_TEXTS: dict[Path, str] = {}


def _tagged(number: str, paths: list[Path]) -> list[Path]:
    tag = re.compile(rf"\b{number}\b")
    return [p for p in paths if tag.search(_TEXTS.get(p) or _TEXTS.setdefault(p, p.read_text()))]


CODE = sorted((ROOT / "bucketq").rglob("*.py"))
TESTS = sorted(p for p in (ROOT / "tests").rglob("*.py") if p.name != Path(__file__).name)
TEXT = PROTOCOL.read_text()
DEFINED = _invariants(TEXT)
ROWS = _table(TEXT)


def test_the_protocol_defines_invariants_and_the_table_has_rows() -> None:
    assert DEFINED[:3] == ["I1", "I2", "I3"], "the invariants section could not be read"
    assert len(DEFINED) == len(set(DEFINED)), "an I-number is defined twice"
    assert len(ROWS) > len(DEFINED), "the invariant table could not be read"


@pytest.mark.parametrize("number", DEFINED)
def test_each_invariant_has_a_row_a_code_tag_and_a_test_tag(number: str) -> None:
    assert number in ROWS, f"{number} has no row in the table of docs/protocol.md"
    assert _tagged(number, CODE), f"no module in bucketq/ is tagged {number} (the code enforcing it)"
    assert _tagged(number, TESTS), f"no test in tests/ is tagged {number} (the test catching its violation)"


def test_every_row_is_an_invariant_of_the_protocol() -> None:
    numbered = [label for label in ROWS if re.fullmatch(r"I\d+", label)]
    assert sorted(numbered) == sorted(DEFINED), "the table has a row for an I-number the protocol lacks"


@pytest.mark.parametrize("label", list(ROWS))
def test_a_rows_modules_exist_and_carry_its_tag(label: str) -> None:
    modules = _names(ROWS[label][0])
    assert modules, f"{label}: no enforcing module named"
    for module in modules:
        path = ROOT / module
        assert path.is_file(), f"{label}: {module} does not exist"
        if re.fullmatch(r"I\d+", label):
            assert _tagged(label, [path]), f"{module} enforces {label} but carries no {label} tag"


@pytest.mark.parametrize("label", list(ROWS))
def test_a_rows_regression_tests_exist(label: str) -> None:
    tests = _names(ROWS[label][1])
    assert tests, f"{label}: no regression test named"
    for ref in tests:
        path, _, name = ref.partition("::")
        source = (ROOT / path).read_text()
        defined = {
            node.name
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in defined, f"{label}: {ref} does not exist"


@pytest.mark.parametrize("label", list(ROWS))
def test_a_rows_simulation_properties_are_the_checkers(label: str) -> None:
    named = _names(ROWS[label][2])
    assert set(named) <= set(SIMULATION_PROPERTIES), (
        f"{label}: unknown properties {set(named) - set(SIMULATION_PROPERTIES)}"
    )
    assert named or ROWS[label][2].startswith("—"), f"{label}: name its properties, or say why none (—)"


def test_every_simulation_property_guards_an_invariant() -> None:
    mapped = {name for cells in ROWS.values() for name in _names(cells[2])}
    assert set(SIMULATION_PROPERTIES) <= mapped, (
        f"checker properties mapped to no invariant: {sorted(set(SIMULATION_PROPERTIES) - mapped)}"
    )


def test_the_tag_search_finds_a_missing_tag() -> None:
    """A check that cannot fail proves nothing: a number no module carries is reported."""
    assert _tagged("I999", CODE) == []
    assert _tagged("I1", CODE) and not _tagged("I1", [ROOT / "bucketq" / "py.typed"])
    assert _invariants("**I7 — a rule.**\n**I70 — another.**\n") == ["I7", "I70"]
