"""Identifiers: UUIDv7 message ids, stable name-derived ids, lease tokens."""

from __future__ import annotations

import secrets
import uuid

import uuid6

_NAMESPACE = uuid.UUID("6b1f3d4e-2c55-4c4a-9a47-0f5d1a2b9c10")


def message_id() -> str:
    """A new UUIDv7 (time-ordered) as a string."""
    return str(uuid6.uuid7())


def stable_id(kind: str, name: str) -> str:
    """The stable UUID of a named producer or consumer (the same name always gives the same id)."""
    return str(uuid.uuid5(_NAMESPACE, f"{kind}:{name}"))


def token() -> str:
    """A fresh lease token or nonce (96 random bits, hex)."""
    return secrets.token_hex(12)
