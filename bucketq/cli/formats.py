"""Parsing and formatting of CLI values: durations, times, headers, ages, JSON payloads.

One duration syntax for every flag that takes one (``--retention``, ``--since``, ``--interval``,
``consumer seek --to``...): a number of seconds, or Go/kubectl style units that may be combined,
``90s``, ``15m``, ``1h30m``, ``7d``, ``2w``, ``250ms``. A point in time is that (an age: so long
ago), an ISO 8601 time or Unix seconds.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import durationpy

from bucketq.cli.errors import CliError

DURATION_HELP = "90s, 15m, 1h30m, 7d"
TIME_HELP = "an age such as 15m or 1h30m, an ISO 8601 time, or Unix seconds"
# A time given as a bare number this large is Unix seconds, not an age: 10^9 s is 2001-09-09.
UNIX_SECONDS_FROM = 1e9


def parse_duration(text: str) -> float:
    """Seconds in ``"90"``, ``"90s"``, ``"15m"``, ``"1h30m"``, ``"7d"`` or ``"2w"`` (positive)."""
    word = text.strip()
    seconds: float | None = None
    try:
        seconds = float(word)
    except ValueError:
        try:
            seconds = durationpy.from_str(word.lower()).total_seconds()
        except (durationpy.DurationError, ValueError, OverflowError):
            seconds = None
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise CliError(
            f"invalid duration {text!r}: use a positive number of seconds or units s, m, h, d, w "
            f"(such as {DURATION_HELP})"
        )
    return seconds


def parse_time(text: str, *, now: float | None = None) -> float:
    """Unix seconds of a point in time: an age (``15m``: that long ago), ISO 8601 or Unix seconds."""
    word = text.strip()
    try:
        number = float(word)
    except ValueError:
        number = None
    if number is not None and number >= UNIX_SECONDS_FROM:
        return number
    try:
        when = datetime.fromisoformat(word)
    except ValueError:
        pass
    else:
        return when.timestamp()  # a time without a zone is local time, as ``date`` prints it
    try:
        return (time.time() if now is None else now) - parse_duration(word)
    except CliError:
        raise CliError(
            f"invalid time {text!r}: give {TIME_HELP} (2026-11-26T14:00:00+00:00, 1795650000)"
        ) from None


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
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def human_duration(seconds: float | None) -> str:
    """``"-"``, ``"850ms"``, ``"4.2s"``, ``"42s"``, ``"7m12s"``, ``"3h5m"``, ``"2d4h"``: one word
    (kubectl's style), so that it never wraps and a column of them splits on whitespace."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h" if s % 86400 // 3600 else f"{s // 86400}d"


def human_time(unix: float) -> str:
    """A point in time as every command prints it: local date and time to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))


def human_age(unix: float | None, now: float) -> str:
    """How long ago ``unix`` was: ``"2m12s ago"``, ``"never"`` for None."""
    if unix is None:
        return "never"
    return f"{human_duration(max(0.0, now - unix))} ago"


def human_bytes(size: int) -> str:
    """``"512B"``, ``"1.5KiB"``, ``"4.0MiB"``: one word, like every value in a table."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{size}B"
