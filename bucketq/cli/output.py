"""Where the CLI prints, and its tables: rich on a terminal, plain aligned columns elsewhere.

Invariants (tests/cli/test_human_output.py checks them on every command):

* a value that identifies a row (a topic, a consumer, a dead-letter topic, a position) and every
  number and duration is printed whole on one line: never truncated, never wrapped. On a
  terminal narrower than such a table the table is printed wider than the terminal (the terminal
  folds the long lines) rather than cut;
* when stdout is not a terminal (piped, redirected, captured) a table is plain text, like
  kubectl's: upper-case headers, columns separated by three spaces, one line per row, no colour,
  no box, whatever the width;
* progress bars and live views are drawn only on a terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich import box
from rich.console import Console
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

# Extra keyword arguments of every Console the CLI makes. Empty in use (rich finds out the width and
# whether the stream is a terminal); tests pin them (width, force_terminal, color_system).
CONSOLE_OPTIONS: dict[str, Any] = {}

ColumnKind = Literal["name", "number", "duration", "text"]
Cell = str | Text
COLUMN_GAP = 3  # spaces between plain columns (kubectl's)


def out() -> Console:
    """Standard output (lines are never wrapped by rich: output may be piped)."""
    return Console(soft_wrap=True, highlight=False, **CONSOLE_OPTIONS)


def stderr() -> Console:
    return Console(stderr=True, soft_wrap=True, highlight=False, **CONSOLE_OPTIONS)


@dataclass(frozen=True)
class Column:
    """A table column. ``name``: identifies the row; ``number`` and ``duration``: right-aligned;
    all three are never cut nor wrapped. ``text`` (free text such as a payload) may wrap on a
    terminal and is printed whole elsewhere."""

    header: str
    kind: ColumnKind = "name"

    @property
    def right(self) -> bool:
        return self.kind in ("number", "duration")


def plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[str]:
    """The table as aligned lines of plain text (no trailing spaces)."""
    texts = [[c.header.upper() for c in columns], *([plain(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in texts) for i in range(len(columns))]
    lines = []
    for line in texts:
        cells = [
            text.rjust(width) if column.right else text.ljust(width)
            for column, text, width in zip(columns, line, widths, strict=True)
        ]
        lines.append((" " * COLUMN_GAP).join(cells).rstrip())
    return lines


def rich_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], title: str | None = None) -> Table:
    """The table for a terminal: a bold header over a rule, no outer box."""
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        header_style="bold",
        pad_edge=False,
        title=title,
        title_justify="left",
    )
    for i, column in enumerate(columns):
        whole = column.kind != "text"
        longest = _longest(column, rows, i)
        table.add_column(
            column.header,
            justify="right" if column.right else "left",
            no_wrap=whole,
            min_width=longest if whole else None,
            overflow="fold",
        )
    for row in rows:
        table.add_row(*row)
    return table


def print_table(
    columns: Sequence[Column],
    rows: Iterable[Sequence[Cell]],
    console: Console | None = None,
    title: str | None = None,
) -> None:
    """Print a table: rich on a terminal (never narrower than its whole cells), plain elsewhere."""
    console = console or out()
    rows = list(rows)
    if not console.is_terminal:
        if title:
            console.print(title, markup=False)
        for line in plain_table(columns, rows):
            console.print(line, markup=False, soft_wrap=True)
        return
    table = rich_table(columns, rows, title)
    width = narrowest(columns, rows)
    if width <= console.width:
        console.print(table)
        return
    # wider than the terminal: rendered at the width it needs (Console.print clips to its own
    # width), the terminal folds the long lines, nothing is cut
    for segments in console.render_lines(table, console.options.update_width(width), pad=False):
        console.print(Segments([*segments, Segment.line()]), soft_wrap=True, end="")


TEXT_MIN_WIDTH = 20  # a free-text column is folded to no narrower than this


def _longest(column: Column, rows: Sequence[Sequence[Cell]], i: int) -> int:
    return max([len(column.header), *(len(plain(row[i])) for row in rows)])


def narrowest(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> int:
    """The width :func:`rich_table` needs to print every whole column whole: their longest cells,
    free text folded to ``TEXT_MIN_WIDTH``, one space of padding each side of a cell but the outer
    ones, and a one-space rule between columns."""
    cells = sum(
        _longest(c, rows, i) if c.kind != "text" else min(TEXT_MIN_WIDTH, _longest(c, rows, i))
        for i, c in enumerate(columns)
    )
    return cells + 3 * (len(columns) - 1)


def print_fields(pairs: Sequence[tuple[str, str]], console: Console | None = None, indent: int = 2) -> None:
    """``label  value`` lines, the values aligned (the head of a describe)."""
    console = console or out()
    width = max((len(label) for label, _ in pairs), default=0)
    for label, value in pairs:
        console.print(f"{' ' * indent}{label.ljust(width)}  {value}", markup=False)
