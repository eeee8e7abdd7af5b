"""Messages as delivered to an application, with their lease receipt."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bucketq.core.segment import Record
from bucketq.errors import BucketqError, InvalidReceipt

if TYPE_CHECKING:
    from bucketq.core.consumer import Consumer

# The one text form of a receipt: a topic name, three decimal integers without sign, padding or
# leading zeros (below 2**63), and a token. int() alone would accept "+0", " 0" or "0_0", so
# different strings would name one lease, and a settlement keyed by the text could be repeated.
_INT = r"(0|[1-9][0-9]{0,18})"
_RECEIPT = re.compile(
    rf"([a-z0-9](?:[a-z0-9.-]{{0,61}}[a-z0-9])?):{_INT}:{_INT}:{_INT}:([A-Za-z0-9_-]{{1,64}})"
)
MAX_POSITION = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Receipt:
    """Identifies one lease: topic, partition, position and token. Opaque to applications."""

    topic: str
    partition: int
    seq: int
    idx: int
    token: str

    def encode(self) -> str:
        return f"{self.topic}:{self.partition}:{self.seq}:{self.idx}:{self.token}"

    @classmethod
    def decode(cls, text: str) -> Receipt:
        """The receipt ``text`` names; InvalidReceipt unless ``text`` is in the canonical form."""
        match = _RECEIPT.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidReceipt(text)
        topic, partition, seq, idx, tok = match.groups()
        receipt = cls(topic, int(partition), int(seq), int(idx), tok)
        if max(receipt.partition, receipt.seq, receipt.idx) > MAX_POSITION:
            raise InvalidReceipt(text)
        return receipt

    @property
    def pos(self) -> tuple[int, int]:
        return (self.seq, self.idx)


@dataclass(slots=True)
class Message:
    """A leased message. Settle it with :meth:`ack`, :meth:`nack` or :meth:`dead_letter`."""

    topic: str
    partition: int
    seq: int
    index: int
    offset: int
    record: Record
    receipt: str
    deliveries: int
    lease_until: float
    # when the lease began: the claim's time on this member's clock (an operator's seek that
    # lands later replays the message even if it is acked after the seek, docs/protocol.md I11)
    leased_at: float = 0.0
    _consumer: Consumer | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def key(self) -> str | None:
        return self.record.key

    @property
    def headers(self) -> Mapping[str, str]:
        return self.record.headers

    @property
    def payload(self) -> Any:
        return self.record.payload

    @property
    def data(self) -> bytes | None:
        return self.record.data

    @property
    def content_type(self) -> str:
        return self.record.content_type

    @property
    def created_at(self) -> float:
        return self.record.created_at

    @property
    def producer_id(self) -> str | None:
        return self.record.producer_id

    @property
    def priority(self) -> int:
        return self.record.priority

    @property
    def position(self) -> tuple[int, int, int]:
        """(partition, segment seq, index)."""
        return (self.partition, self.seq, self.index)

    def _owner(self) -> Consumer:
        if self._consumer is None:
            raise BucketqError("message is detached from its consumer")
        return self._consumer

    async def ack(self) -> None:
        """Mark done (idempotent). Raises LeaseLost if the lease expired and was taken elsewhere."""
        await self._owner().ack(self.receipt)

    async def nack(self, *, requeue: bool = True, delay: float = 0.0) -> None:
        """Give the message back (visible again after ``delay``), or dead-letter it with requeue=False."""
        await self._owner().nack(self.receipt, requeue=requeue, delay=delay)

    async def release(self) -> None:
        """Give the message back now, uncounted (it does not move towards dead-lettering)."""
        await self._owner().release(self.receipt)

    async def extend(self, seconds: float) -> None:
        """Keep the lease for ``seconds`` from now."""
        await self._owner().extend(self.receipt, seconds)

    async def dead_letter(self, reason: str = "rejected") -> None:
        """Move to the dead-letter topic now."""
        await self._owner().nack(self.receipt, requeue=False, reason=reason)
