"""Status of custom resources: conditions that keep their transition time, and minimal status patches."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

READY = "Ready"
STORAGE_REACHABLE = "StorageReachable"
DEAD_LETTER_POLICY = "DeadLetterPolicyResolved"
TOPICS_READY = "TopicsReady"
# True when a subscription of the consumer has work waiting but nobody is doing it (docs/operations.md)
STALLED = "Stalled"

MAX_MESSAGE = 1024


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Cond:
    """A condition to set: ``ok`` True/False (None: Unknown)."""

    type: str
    ok: bool | None
    reason: str
    message: str = ""


def merge_conditions(
    current: Iterable[Mapping[str, Any]] | None, updates: Iterable[Cond], generation: int | None
) -> list[dict[str, Any]]:
    """``current`` with ``updates`` applied; lastTransitionTime changes only when the status does."""
    out = {str(c.get("type")): dict(c) for c in current or ()}
    for cond in updates:
        status = "Unknown" if cond.ok is None else str(cond.ok)
        old = out.get(cond.type, {})
        entry: dict[str, Any] = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message[:MAX_MESSAGE],
            "lastTransitionTime": old.get("lastTransitionTime") if old.get("status") == status else now_iso(),
        }
        if entry["lastTransitionTime"] is None:
            entry["lastTransitionTime"] = now_iso()
        if generation is not None:
            entry["observedGeneration"] = generation
        out[cond.type] = entry
    return sorted(out.values(), key=lambda c: str(c["type"]))


def patch_status(
    patch_status: MutableMapping[str, Any], current: Mapping[str, Any] | None, desired: Mapping[str, Any]
) -> None:
    """Put into the status patch only the fields of ``desired`` that differ from ``current``."""
    current = current or {}
    for key, value in desired.items():
        if current.get(key) != value:
            patch_status[key] = value


def condition(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of that type in a status, if any."""
    for cond in (status or {}).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return None
