"""The key layout of storage protocol v1: the only module that spells object keys."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from bucketq.errors import InvalidName

SEQ_WIDTH = 16
PARTITION_WIDTH = 4
MAX_PARTITIONS = 10**PARTITION_WIDTH
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")


def validate_name(name: str, what: str = "topic") -> str:
    """Check a topic or consumer name: DNS-1123 characters, 1-63 long, usable as an S3 prefix.

    Lower-case letters, digits, ``-`` and ``.``; starts and ends with a letter or digit; no ``..``.
    Dots are allowed so that the default dead-letter topic ``{topic}.dlq`` is a valid name.
    """
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidName(
            f"invalid {what} name {name!r}: use 1-63 lower-case letters, digits, '-' or '.', "
            "starting and ending with a letter or digit (DNS-1123)"
        )
    return name


def seq_str(seq: int) -> str:
    return f"{seq:0{SEQ_WIDTH}d}"


def parse_seq(key: str) -> int:
    """The sequence number at the end of a segment, delta or checkpoint key bucketq wrote.

    Strict: raises ``ValueError`` on any other name. Code walking a LIST of a data prefix uses
    :func:`seq_of` instead, which tells a foreign name apart (a listing may meet one, I8)."""
    stem = key.rsplit("/", 1)[-1].split(".", 1)[0]
    return int(stem)


_SEQ_NAME = re.compile(rf"(\d{{{SEQ_WIDTH}}})\.(jsonl|json)")
_HEARTBEAT_NAME = re.compile(r"[^/]+\.json")
_DEDUP_NAME = re.compile(r"[0-9a-f]{64}")


def seq_of(key: str, ext: Literal["jsonl", "json"]) -> int | None:
    """The number of a segment (``ext="jsonl"``), delta or checkpoint (``"json"``) key exactly as
    :class:`Keys` spells it; ``None`` for any other name under the prefix (a ``.keep``, a
    ``README.txt``, a folder marker, a sync tool's lock file: a foreign object, invariant I8).

    Every listing of ``seg/``, ``log/`` and ``ckpt/`` parses names with this, never with
    ``int()``: LIST order puts ``.keep`` before the numbers and ``README.txt`` after them, so a
    listing must skip such a name wherever it sorts, not stop or fail on it."""
    found = _SEQ_NAME.fullmatch(key.rsplit("/", 1)[-1])
    if found is None or found[2] != ext:
        return None
    return int(found[1])


def heartbeat_member(key: str, prefix: str) -> str | None:
    """The member a heartbeat key under ``prefix`` (``Keys.members_prefix``) belongs to, or
    ``None`` when the name is not ``{member}.json`` directly under it (a foreign object)."""
    rest = key[len(prefix) :] if key.startswith(prefix) else ""
    if _HEARTBEAT_NAME.fullmatch(rest) is None or rest == ".json":
        return None
    return rest[: -len(".json")]


# A transaction record's id (``{job}.{n:06d}``, a job id being ASCII letters, digits and '-') and a
# columnar chunk's name under ``chunk/`` (``{job}/{run}/t{task}-a{attempt}/p{PPPP}-{n}.arrow``)
_TXN_ID = r"[A-Za-z0-9-]{1,128}\.\d{6,}"
_CHUNK_NAME = rf"[A-Za-z0-9-]{{1,128}}/[A-Za-z0-9-]+/t\d+-a\d+/p\d{{{PARTITION_WIDTH}}}-\d{{6,}}\.arrow"


def txn_of(key: str, prefix: str) -> str | None:
    """The transaction id of a record key under ``prefix`` (``Keys.txn_prefix``), or ``None`` for
    any other name there (a foreign object, I8: never read as a record)."""
    rest = key[len(prefix) :] if key.startswith(prefix) else ""
    if not rest.endswith(".json") or re.fullmatch(_TXN_ID, rest[: -len(".json")]) is None:
        return None
    return rest[: -len(".json")]


def chunk_name_of(key: str, prefix: str) -> str | None:
    """The name of a columnar chunk key under ``prefix`` (``Keys.chunks_prefix``), or ``None`` for
    any other name there (a foreign object, I8: never deleted by GC)."""
    rest = key[len(prefix) :] if key.startswith(prefix) else ""
    return rest if re.fullmatch(_CHUNK_NAME, rest) is not None else None


# What bucketq writes under a topic's prefix R/{topic}/ (the rest of the key), for listings that
# must not touch anything else: GC's collection of a deleted topic's leftovers.
_TOPIC_OBJECT = re.compile(
    rf"p\d{{{PARTITION_WIDTH}}}/(seg/\d{{{SEQ_WIDTH}}}\.jsonl|head\.json|floor\.json)"
    rf"|subs/[a-z0-9][a-z0-9.-]*/p\d{{{PARTITION_WIDTH}}}/((log|ckpt)/\d{{{SEQ_WIDTH}}}\.json|trim\.json)"
    rf"|dedup/[0-9a-f]{{64}}|txn/{_TXN_ID}\.json|chunk/{_CHUNK_NAME}|\.topic|\.wake"
)


def is_topic_object(key: str, topic_prefix: str) -> bool:
    """Whether ``key`` (under ``topic_prefix``, ``Keys.topic_prefix``) is an object bucketq writes
    for a topic, spelled exactly as :class:`Keys` spells it; anything else is foreign."""
    return key.startswith(topic_prefix) and _TOPIC_OBJECT.fullmatch(key[len(topic_prefix) :]) is not None


def is_dedup_key(key: str, prefix: str) -> bool:
    """Whether ``key`` is a dedup marker under ``prefix`` (``Keys.dedup_prefix``): a SHA-256 hex
    digest, as :meth:`Keys.dedup` spells it."""
    return key.startswith(prefix) and _DEDUP_NAME.fullmatch(key[len(prefix) :]) is not None


@dataclass(frozen=True, slots=True)
class Keys:
    """Keys under one root prefix ``R`` (empty, or e.g. ``bucketq/team-a``)."""

    root: str = ""

    def _k(self, rest: str) -> str:
        return f"{self.root}/{rest}" if self.root else rest

    @property
    def prefix(self) -> str:
        return self._k("")

    # bootstrap and probe
    def format_marker(self) -> str:
        return self._k("_bucketq/format.json")

    def probes_prefix(self) -> str:
        return self._k("_probe/")

    def probe(self, token: str) -> str:
        return self._k(f"_probe/{token}.probe")

    # registry
    def producers_prefix(self) -> str:
        return self._k("_registry/producers/")

    def producer(self, producer_id: str) -> str:
        return self._k(f"_registry/producers/{producer_id}.json")

    def consumer(self, consumer_id: str) -> str:
        return self._k(f"_registry/consumers/{consumer_id}.json")

    def members_topic_prefix(self, topic: str) -> str:
        return self._k(f"_registry/members/{topic}/")

    def members_prefix(self, topic: str, consumer: str) -> str:
        return self._k(f"_registry/members/{topic}/{consumer}/")

    def member(self, topic: str, consumer: str, member: str) -> str:
        return self._k(f"_registry/members/{topic}/{consumer}/{member}.json")

    # topics
    def topics_prefix(self) -> str:
        return self._k("")

    def topic_prefix(self, topic: str) -> str:
        return self._k(f"{topic}/")

    def topic_marker(self, topic: str) -> str:
        return self._k(f"{topic}/.topic")

    def wake(self, topic: str) -> str:
        """The topic's advisory wake object (core/wake.py)."""
        return self._k(f"{topic}/.wake")

    def partition_prefix(self, topic: str, partition: int) -> str:
        return self._k(f"{topic}/p{partition:0{PARTITION_WIDTH}d}/")

    def segments_prefix(self, topic: str, partition: int) -> str:
        return self.partition_prefix(topic, partition) + "seg/"

    def segment(self, topic: str, partition: int, seq: int) -> str:
        return self.segments_prefix(topic, partition) + f"{seq_str(seq)}.jsonl"

    def head(self, topic: str, partition: int) -> str:
        return self.partition_prefix(topic, partition) + "head.json"

    def segment_floor(self, topic: str, partition: int) -> str:
        """The partition's GC fence: segments below its ``seq`` may be freed (see core/fences.py)."""
        return self.partition_prefix(topic, partition) + "floor.json"

    def dedup(self, topic: str, dedup_id: str) -> str:
        digest = hashlib.sha256(dedup_id.encode()).hexdigest()
        return self._k(f"{topic}/dedup/{digest}")

    def dedup_prefix(self, topic: str) -> str:
        return self._k(f"{topic}/dedup/")

    # subscriptions
    def subs_prefix(self, topic: str) -> str:
        return self._k(f"{topic}/subs/")

    def subscription_prefix(self, topic: str, consumer: str) -> str:
        return self._k(f"{topic}/subs/{consumer}/")

    def sub_partition_prefix(self, topic: str, consumer: str, partition: int) -> str:
        return self._k(f"{topic}/subs/{consumer}/p{partition:0{PARTITION_WIDTH}d}/")

    def delta(self, topic: str, consumer: str, partition: int, n: int) -> str:
        return self.sub_partition_prefix(topic, consumer, partition) + f"log/{seq_str(n)}.json"

    def deltas_prefix(self, topic: str, consumer: str, partition: int) -> str:
        return self.sub_partition_prefix(topic, consumer, partition) + "log/"

    def checkpoint(self, topic: str, consumer: str, partition: int, n: int) -> str:
        return self.sub_partition_prefix(topic, consumer, partition) + f"ckpt/{seq_str(n)}.json"

    def checkpoints_prefix(self, topic: str, consumer: str, partition: int) -> str:
        return self.sub_partition_prefix(topic, consumer, partition) + "ckpt/"

    def log_trim(self, topic: str, consumer: str, partition: int) -> str:
        """The cursor log's GC fence: deltas at or below its ``n`` may be freed (see core/fences.py)."""
        return self.sub_partition_prefix(topic, consumer, partition) + "trim.json"

    # job commits (transactions, docs/protocol.md "Job commits")
    def txn_prefix(self, topic: str) -> str:
        return self._k(f"{topic}/txn/")

    def txn(self, topic: str, txn_id: str) -> str:
        return self._k(f"{topic}/txn/{txn_id}.json")

    # columnar chunks of write jobs (format 5, core/chunks.py): written once at their final key,
    # ``{job}/{run}/{attempt}/p{PPPP}-{n}.arrow``, made part of a partition by a reference segment
    def chunks_prefix(self, topic: str) -> str:
        return self._k(f"{topic}/chunk/")

    def chunk(self, topic: str, name: str) -> str:
        """A chunk's key from its name (its path under :meth:`chunks_prefix`)."""
        return self._k(f"{topic}/chunk/{name}")

    def chunk_run_prefix(self, topic: str, job: str, run: str | None = None) -> str:
        """Every chunk of a write job (or of one run of it) in ``topic``."""
        return self._k(f"{topic}/chunk/{job}/" + (f"{run}/" if run else ""))

    # Spark jobs: per-run staging areas, abort markers, job reports and pipeline intents
    def spark_prefix(self) -> str:
        return self._k("_spark/")

    def spark_staging_prefix(self) -> str:
        return self._k("_spark/staging/")

    def spark_staging(self, job: str, run: str, attempt: str | None = None) -> str:
        """A write run's staging root (no trailing slash), or one task attempt's inside it."""
        rest = f"_spark/staging/{job}/{run}" + (f"/{attempt}" if attempt else "")
        return self._k(rest)

    def spark_aborted_prefix(self) -> str:
        return self._k("_spark/aborted/")

    def spark_aborted(self, job: str, run: str) -> str:
        return self._k(f"_spark/aborted/{job}/{run}")

    def spark_job(self, job: str) -> str:
        return self._k(f"_spark/jobs/{job}.json")

    def spark_intents_prefix(self, kind: str) -> str:
        return self._k(f"_spark/{kind}/")

    def spark_intent(self, kind: str, name: str) -> str:
        return self._k(f"_spark/{kind}/{name}.json")


# What key_kind() looks for, most specific first; written next to Keys so the two change together.
# Names are DNS-1123 (no "/" or "_"), so a topic or consumer name cannot fake a "_..." marker, and
# the partition component (pNNNN) anchors the per-partition objects. A LIST prefix classifies like
# the keys under it. Without the root, a few prefixes stay ambiguous (the prefix of a topic named
# "subs" reads as a subscription): fine for counting requests, never used to route them.
_P = rf"/p\d{{{PARTITION_WIDTH}}}/"
_KINDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r"_bucketq/", "format"),
        (r"_probe/", "probe"),
        (r"_registry/members/", "member"),
        (r"_registry/", "registry"),
        (r"_spark/", "spark"),
        (rf"/subs/[^/]+{_P}log/", "delta"),
        (rf"/subs/[^/]+{_P}ckpt/", "checkpoint"),
        (rf"/subs/[^/]+{_P}trim\.json$", "fence"),
        (rf"{_P}seg/", "segment"),
        (rf"{_P}head\.json$", "head"),
        (rf"{_P}floor\.json$", "fence"),
        (r"/dedup/", "dedup"),
        (r"/txn/", "txn"),
        (r"/chunk/", "chunk"),
        (r"/\.topic$", "topic"),
        (r"/\.wake$", "wake"),
        (r"/subs/", "subscription"),  # last: a topic may be named "subs"
    )
)


def key_kind(key: str) -> str:
    """The kind of protocol object a key or LIST prefix of :class:`Keys` (any root) names.

    One of ``format``, ``probe``, ``member``, ``registry``, ``spark``, ``delta``, ``checkpoint``,
    ``fence``, ``subscription``, ``segment``, ``head``, ``dedup``, ``txn``, ``chunk``, ``topic``, ``wake``; ``other``
    for anything else (a topic or root prefix). For metering and diagnostics (``bucketq bench``
    counts requests by kind); the engine itself only ever builds keys.
    """
    for pattern, kind in _KINDS:
        if pattern.search(key):
            return kind
    return "other"


def namespace_root(base: str, namespace: str) -> str:
    """The root of a Kubernetes namespace's queues under the operator's root ``base``:
    ``{base}/{namespace}`` (or the namespace alone). The operator and the CLI's ``--namespace``
    both use it, so they always agree on where a namespace's topics live."""
    base = base.strip("/")
    return f"{base}/{namespace}" if base else namespace
