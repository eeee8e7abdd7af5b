"""Parsing and formatting of CLI values: durations, headers, ages, JSON payloads."""

from __future__ import annotations

import json
import re
from typing import Any

from bucketq.cli.errors import CliError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``"90"``, ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"`` or ``"2w"``."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise CliError(
            f"invalid duration {text!r}: use a positive number with an optional unit s, m, h, d or w"
        )
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_headers(items: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict (a value may contain ``=``)."""
    headers: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CliError(f"invalid header {item!r}: use --header name=value")
        headers[name.strip()] = value
    return headers


def parse_payload(text: str, where: str) -> Any:
    """A JSON value, or a CliError naming ``where`` it came from."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"invalid JSON payload ({where}): {exc.msg} at column {exc.colno}; use --raw to send text"
        ) from None


def explain(exc: Exception) -> str:
    """A pydantic ValidationError as ``"field: problem; ..."`` (other errors as their text)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return " ".join(str(exc).split())
    parts = []
    for err in errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "value"
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def human_duration(seconds: float | None) -> str:
    """``"-"``, ``"850ms"``, ``"42s"``, ``"7m 12s"``, ``"3h 05m"``, ``"2d 04h"``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
