"""Registry of named producers and consumers: stable ids and heartbeats under ``_registry/``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from bucketq.core.ids import stable_id
from bucketq.core.keys import Keys, validate_name
from bucketq.errors import AlreadyExists, Contended
from bucketq.storage import Storage

Kind = Literal["producer", "consumer"]


@dataclass(frozen=True, slots=True)
class Registration:
    kind: Kind
    name: str
    id: str
    created_at: float
    last_seen: float
    meta: dict[str, Any]


class Registry:
    """Registers names with ids derived from the name, so re-registration returns the same id."""

    def __init__(self, storage: Storage, keys: Keys) -> None:
        self.storage = storage
        self.keys = keys

    def _key(self, kind: Kind, ident: str) -> str:
        return self.keys.producer(ident) if kind == "producer" else self.keys.consumer(ident)

    async def register(self, kind: Kind, name: str, **meta: Any) -> Registration:
        """Create the registration (put-if-absent) or refresh it; the id is stable per name."""
        validate_name(name, kind)
        ident = stable_id(kind, name)
        now = time.time()
        body = {"kind": kind, "name": name, "id": ident, "created_at": now, "last_seen": now, "meta": meta}
        key = self._key(kind, ident)
        try:
            await self.storage.create(key, json.dumps(body).encode())
            return Registration(kind, name, ident, now, now, meta)
        except (AlreadyExists, Contended):
            pass
        existing = await self.get(kind, name)
        created = existing.created_at if existing else now
        body["created_at"] = created
        await self.storage.overwrite(key, json.dumps(body).encode())
        return Registration(kind, name, ident, created, now, meta)

    async def heartbeat(self, reg: Registration) -> Registration:
        """Refresh ``last_seen`` of a registration made earlier (one overwrite)."""
        now = time.time()
        body = {
            "kind": reg.kind,
            "name": reg.name,
            "id": reg.id,
            "created_at": reg.created_at,
            "last_seen": now,
            "meta": reg.meta,
        }
        await self.storage.overwrite(self._key(reg.kind, reg.id), json.dumps(body).encode())
        return Registration(reg.kind, reg.name, reg.id, reg.created_at, now, reg.meta)

    async def unregister(self, kind: Kind, name: str) -> bool:
        """Delete the registration of ``name``; False when there was none."""
        key = self._key(kind, stable_id(kind, name))
        if await self.storage.head(key) is None:
            return False
        await self.storage.delete([key])
        return True

    async def get(self, kind: Kind, name: str) -> Registration | None:
        blob = await self.storage.get(self._key(kind, stable_id(kind, name)))
        if blob is None:
            return None
        obj = json.loads(blob.data)
        return Registration(
            kind,
            obj["name"],
            obj["id"],
            float(obj["created_at"]),
            float(obj["last_seen"]),
            obj.get("meta", {}),
        )
