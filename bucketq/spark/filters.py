"""Filter pushdown (Spark >= 4.1): partition, seq and created_at predicates narrow the read.

Only predicates the reader applies exactly are reported as handled; Spark evaluates the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from bucketq.core.keys import MAX_PARTITIONS
from bucketq.spark.options import ReadConfig


def _name(f: Any) -> str | None:
    attr = getattr(f, "attribute", None)
    return attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None


def _seconds(value: Any) -> float | None:
    return value.timestamp() if isinstance(value, datetime) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def push(cfg: ReadConfig, filters: Iterable[Any]) -> list[Any]:
    """Apply what we can to ``cfg`` (in place); return the filters Spark must still evaluate."""
    left = []
    for f in filters:
        if not _apply(cfg, f):
            left.append(f)
    return left


def _apply(cfg: ReadConfig, f: Any) -> bool:
    kind = type(f).__name__
    name = _name(f)
    value = getattr(f, "value", None)
    if name == "partition":
        return _partition(cfg, kind, value)
    if name == "seq":
        return _seq(cfg, kind, value)
    if name == "created_at":
        return _created(cfg, kind, value)
    return False


def _partition(cfg: ReadConfig, kind: str, value: Any) -> bool:
    if kind == "In":
        wanted = {v for v in value if _int(v) is not None}
        if len(wanted) != len(value):
            return False
    else:
        n = _int(value)
        test = _PARTITION_TESTS.get(kind)
        if n is None or test is None:
            return False
        wanted = {p for p in range(MAX_PARTITIONS) if test(p, n)}
    cfg.partitions = frozenset(wanted) if cfg.partitions is None else cfg.partitions & wanted
    cfg.empty = cfg.empty or not cfg.partitions
    return True


_PARTITION_TESTS: dict[str, Callable[[int, int], bool]] = {
    "EqualTo": lambda p, n: p == n,
    "GreaterThan": lambda p, n: p > n,
    "GreaterThanOrEqual": lambda p, n: p >= n,
    "LessThan": lambda p, n: p < n,
    "LessThanOrEqual": lambda p, n: p <= n,
}


def _seq(cfg: ReadConfig, kind: str, value: Any) -> bool:
    n = _int(value)
    if n is None:
        return False
    lo, hi = cfg.start_seq, cfg.end_seq
    if kind == "EqualTo":
        lo, hi = max(lo, n), n + 1 if hi is None else min(hi, n + 1)
    elif kind == "GreaterThan":
        lo = max(lo, n + 1)
    elif kind == "GreaterThanOrEqual":
        lo = max(lo, n)
    elif kind == "LessThan":
        hi = n if hi is None else min(hi, n)
    elif kind == "LessThanOrEqual":
        hi = n + 1 if hi is None else min(hi, n + 1)
    else:
        return False
    cfg.start_seq, cfg.end_seq = max(0, lo), hi
    cfg.empty = cfg.empty or (hi is not None and hi <= lo)
    return True


def _created(cfg: ReadConfig, kind: str, value: Any) -> bool:
    ts = _seconds(value)
    if ts is None:
        return False
    if kind in ("GreaterThan", "GreaterThanOrEqual"):
        exclusive = kind == "GreaterThan"
        if cfg.since is None or ts > cfg.since or (ts == cfg.since and exclusive):
            cfg.since, cfg.since_exclusive = ts, exclusive
        return True
    if kind in ("LessThan", "LessThanOrEqual"):
        inclusive = kind == "LessThanOrEqual"
        if cfg.until is None or ts < cfg.until or (ts == cfg.until and not inclusive):
            cfg.until, cfg.until_inclusive = ts, inclusive
        return True
    return False
