"""Help text of the typer entry points (``bucketq`` and ``python -m bucketq.sidecar``), alike.

Both call :func:`flags_take_no_value` and :func:`reflow_help` before they parse, so the same
command prints the same help whichever way it was started.
"""

from __future__ import annotations

from typing import Any

import typer


def flags_take_no_value() -> None:
    """Typer's help shows a value type for every option, ``<bool>`` for flags too, as if they took
    one: a flag's type column is left empty instead (idempotent)."""
    from typer.core import TyperOption

    typed = TyperOption.display_type_rich
    if getattr(typed, "_bucketq_flags", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else typed(self, ctx)

    display_type_rich._bucketq_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def reflow_help(typer_app: typer.Typer) -> None:
    """Each paragraph of every command's docstring as one line: typer's rich help keeps a
    docstring's line breaks, which then break lines mid-sentence in the help and the command list."""
    import inspect

    for info in typer_app.registered_commands:
        doc = info.help or (inspect.getdoc(info.callback) if info.callback else None)
        if doc:
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
