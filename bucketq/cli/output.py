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

import textwrap
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


def rich_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    title: str | None = None,
    width: int | None = None,
) -> Table:
    """The table for a terminal: a bold header over a rule, no outer box.

    Rich never wraps or cuts a cell here: free-text cells are wrapped beforehand (at spaces, to
    fit ``width``; see :func:`fit_text`) and every column is as wide as its widest line. (Left to
    itself, rich may wrap a cell at one width and draw it at a narrower one, dropping characters.)
    """
    rows = fit_text(columns, rows, width) if width is not None else rows
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        header_style="bold",
        pad_edge=False,
        title=title,
        title_justify="left",
    )
    for i, column in enumerate(columns):
        table.add_column(
            column.header,
            justify="right" if column.right else "left",
            no_wrap=True,
            min_width=_widest_line(column, rows, i),
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
    table = rich_table(columns, rows, title, width=console.width)
    width = table_width(columns, fit_text(columns, rows, console.width))
    if width <= console.width:
        console.print(table)
        return
    # wider than the terminal: rendered at the width it needs (Console.print clips to its own
    # width), the terminal folds the long lines, nothing is cut
    for segments in console.render_lines(table, console.options.update_width(width), pad=False):
        console.print(Segments([*segments, Segment.line()]), soft_wrap=True, end="")


TEXT_MIN_WIDTH = 12  # a free-text column is wrapped to no narrower than this...
TEXT_WORD_MAX = 30  # ...nor than its longest word, up to this many characters


def _widest_line(column: Column, rows: Sequence[Sequence[Cell]], i: int) -> int:
    return max(
        [len(column.header), *(len(line) for row in rows for line in plain(row[i]).splitlines() or [""])]
    )


def _narrowest_text(column: Column, rows: Sequence[Sequence[Cell]], i: int) -> int:
    """How narrow a free-text column may be wrapped: not inside a word (a reason such as
    ``max_deliveries``), unless the word is very long."""
    words = [len(w) for row in rows for w in plain(row[i]).split()]
    return min(_widest_line(column, rows, i), max(TEXT_MIN_WIDTH, min(TEXT_WORD_MAX, max(words, default=0))))


def table_width(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> int:
    """The width of :func:`rich_table`'s table: the columns, one space of padding each side of a
    cell but the outer ones, and a one-space rule between columns."""
    return sum(_widest_line(c, rows, i) for i, c in enumerate(columns)) + 3 * (len(columns) - 1)


def fit_text(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int) -> list[Sequence[Cell]]:
    """``rows`` with their free-text cells wrapped so that the table fits ``width`` if it can:
    the whole columns keep their widest cell, the text columns share the rest, each no narrower
    than :func:`_narrowest_text` and no wider than its widest line."""
    text = [i for i, c in enumerate(columns) if c.kind == "text"]
    if not text or table_width(columns, rows) <= width:
        return list(rows)
    whole = sum(_widest_line(c, rows, i) for i, c in enumerate(columns) if c.kind != "text")
    room = width - whole - 3 * (len(columns) - 1)
    limits: dict[int, int] = {}
    # the narrowest content first, so that what a short column leaves goes to the others
    for left, i in enumerate(sorted(text, key=lambda i: _widest_line(columns[i], rows, i)), start=0):
        share = room // (len(text) - left)
        limits[i] = max(_narrowest_text(columns[i], rows, i), min(_widest_line(columns[i], rows, i), share))
        room -= limits[i]
    return [
        [
            "\n".join(textwrap.wrap(plain(cell), limits[i], break_on_hyphens=False) or [""])
            if i in limits
            else cell
            for i, cell in enumerate(row)
        ]
        for row in rows
    ]


def print_fields(pairs: Sequence[tuple[str, str]], console: Console | None = None, indent: int = 2) -> None:
    """``label  value`` lines, the values aligned (the head of a describe)."""
    console = console or out()
    width = max((len(label) for label, _ in pairs), default=0)
    for label, value in pairs:
        console.print(f"{' ' * indent}{label.ljust(width)}  {value}", markup=False)
