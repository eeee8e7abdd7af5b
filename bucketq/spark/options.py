"""Options of the ``bucketq`` data source: connection settings, read filters and write tuning.

Spark hands options over as a case-insensitive string mapping. Connection settings are resolved
once, on the driver, into a plain dict (:func:`resolve_settings`) that travels to the executors
with the reader or writer, so every task sees the same bucket whatever its environment.
"""

from __future__ import annotations

import difflib
import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from bucketq.config import Settings
from bucketq.core.keys import validate_name
from bucketq.errors import ConfigError

# option name (lower case) -> Settings field
CONNECTION_OPTIONS: dict[str, str] = {
    "endpoint": "s3_endpoint_url",
    "endpointurl": "s3_endpoint_url",
    "bucket": "s3_bucket",
    "accesskeyid": "s3_access_key_id",
    "secretaccesskey": "s3_secret_access_key",
    "region": "s3_region",
    "root": "root",
    "strategy": "strategy",
    "backend": "backend",
    "filepath": "file_path",
}

# Every option a bucketq read, stream or write understands (lower case; Spark's are case-insensitive)
COMMON_OPTIONS = frozenset({*CONNECTION_OPTIONS, "config", "topic"})
READ_OPTIONS = frozenset(
    {
        "consumer",
        "partitions",
        "startseq",
        "endseq",
        "since",
        "until",
        "splitbytes",
        "minpartitions",
        "deadletters",
        "pushdown",
        "columns",
    }
)
STREAM_OPTIONS = frozenset(
    {
        "partitions",
        "since",
        "until",
        "splitbytes",
        "minpartitions",
        "startingoffsets",
        "maxsegmentspertrigger",
        "columns",
    }
)
WRITE_OPTIONS = frozenset(
    {
        "batchmessages",
        "batchbytes",
        "payloadformat",
        "keepids",
        "jobid",
        "compression",
        "txntimeout",
        "changedinput",
    }
)
# How the options are spelled in the docs (for error messages)
SPELLING = {
    name.lower(): name
    for name in (
        "endpoint",
        "endpointUrl",
        "bucket",
        "accessKeyId",
        "secretAccessKey",
        "region",
        "root",
        "strategy",
        "backend",
        "filePath",
        "config",
        "topic",
        "consumer",
        "partitions",
        "startSeq",
        "endSeq",
        "since",
        "until",
        "splitBytes",
        "minPartitions",
        "deadLetters",
        "pushdown",
        "columns",
        "startingOffsets",
        "maxSegmentsPerTrigger",
        "batchMessages",
        "batchBytes",
        "payloadFormat",
        "keepIds",
        "jobId",
        "compression",
        "txnTimeout",
        "changedInput",
    )
}
# Chunk compression: Arrow IPC buffers compressed with zstd, or none. "zlib" (the segment codec
# job commits used before chunks) is taken as zstd, so jobs written for older releases still run.
COMPRESSIONS = ("none", "zstd", "zlib")
CHANGED_INPUT = ("warn", "fail")
DEFAULT_TXN_TIMEOUT_S = 900.0

DEFAULT_SPLIT_BYTES = 32 * 1024 * 1024
DEFAULT_MIN_PARTITIONS = 4
# A chunk holds at most this many messages or this many uncompressed bytes: few, large objects
# (the commit's requests per message), small enough for a consumer to hold one reference
# segment's records (a reference segment holds at most MAX_BATCH_MESSAGES messages).
DEFAULT_BATCH_MESSAGES = 100_000
DEFAULT_BATCH_BYTES = 32 * 1024 * 1024
MAX_BATCH_MESSAGES = 100_000  # ProducerSettings.max_batch_messages


def lower(options: Mapping[str, str]) -> dict[str, str]:
    """The options with lower-case names (Spark's option names are case-insensitive)."""
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def check_options(options: Mapping[str, str], kind: str, allowed: frozenset[str]) -> None:
    """Refuse options this ``kind`` of use does not know: a misspelled one would be ignored silently."""
    known = COMMON_OPTIONS | allowed
    unknown = sorted(str(k) for k in options if str(k).lower() not in known)
    if not unknown:
        return
    valid = sorted(SPELLING.get(k, k) for k in known)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.7)
        if close:
            hints.append(f"{name!r} (did you mean {SPELLING.get(close[0], close[0])!r}?)")
        else:
            hints.append(repr(name))
    raise ConfigError(
        f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(hints)} for a bucketq {kind}; "
        f"valid options: {', '.join(valid)}"
    )


def resolve_settings(options: Mapping[str, str]) -> dict[str, Any]:
    """Engine settings from the options, then ``config`` (a YAML file), then ``BUCKETQ_*``.

    Returns a JSON-able dict with secrets revealed, for :meth:`Settings.from_dict` on executors.
    """
    opts = lower(options)
    given = {fld: opts[name] for name, fld in CONNECTION_OPTIONS.items() if opts.get(name)}
    config = opts.get("config")
    if config:
        data = Settings.from_yaml(config).model_dump()
        data.update(given)
        settings = Settings.from_dict(_plain(data))
    else:
        settings = Settings.load(**given)
    return _plain(settings.model_dump())


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, SecretStr):
            out[key] = value.get_secret_value()
        elif isinstance(value, Path):
            out[key] = str(value)
        elif isinstance(value, dict):
            out[key] = _plain(value)
        else:
            out[key] = value
    return out


def settings_options(settings: Settings) -> dict[str, str]:
    """Data source options that reproduce ``settings``' connection (for pipelines and tests)."""
    out: dict[str, str] = {
        "backend": settings.backend,
        "strategy": settings.strategy,
        "region": settings.s3_region,
    }
    if settings.root:
        out["root"] = settings.root
    if settings.s3_endpoint_url:
        out["endpoint"] = settings.s3_endpoint_url
    if settings.s3_bucket:
        out["bucket"] = settings.s3_bucket
    if settings.s3_access_key_id is not None:
        out["accessKeyId"] = settings.s3_access_key_id.get_secret_value()
    if settings.s3_secret_access_key is not None:
        out["secretAccessKey"] = settings.s3_secret_access_key.get_secret_value()
    if settings.file_path is not None:
        out["filePath"] = str(settings.file_path)
    return out


def parse_time(text: str, what: str) -> float:
    """A unix timestamp from ``text``: seconds since the epoch, or ISO-8601 (UTC when no zone)."""
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"option {what}={text!r}: use ISO-8601 or unix seconds") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    if not math.isfinite(value):
        raise ConfigError(f"option {what}={text!r} is not a finite time")
    return value


def _int(opts: dict[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    text = opts.get(name.lower())
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"option {name}={text!r} must be an integer") from None
    if value < minimum:
        raise ConfigError(f"option {name}={value} must be at least {minimum}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None or text == "":
        return default
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name}={text!r} must be true or false")


def _batch_messages(opts: dict[str, str]) -> int:
    value = _int(opts, "batchMessages", DEFAULT_BATCH_MESSAGES, 1) or DEFAULT_BATCH_MESSAGES
    if value > MAX_BATCH_MESSAGES:
        raise ConfigError(f"option batchMessages={value} is above the engine's limit of {MAX_BATCH_MESSAGES}")
    return value


def _topic(opts: dict[str, str]) -> str:
    topic = opts.get("topic")
    if not topic:
        raise ConfigError("the bucketq data source needs option('topic', ...)")
    return validate_name(topic)


@dataclass(frozen=True)
class ReadConfig:
    """What to read: the topic, an optional consumer, and the filters (all picklable).

    Immutable: a reader's configuration is fixed when Spark makes the reader, so nothing one
    query does can change what another query of the same DataFrame reads.
    """

    settings: dict[str, Any]
    topic: str
    consumer: str | None = None
    partitions: frozenset[int] | None = None  # None: every partition
    start_seq: int = 0  # inclusive
    end_seq: int | None = None  # exclusive
    since: float | None = None  # created_at >= since (or > with since_exclusive)
    until: float | None = None  # created_at < until (or <= with until_inclusive)
    since_exclusive: bool = False
    until_inclusive: bool = False
    split_bytes: int = DEFAULT_SPLIT_BYTES
    min_partitions: int = DEFAULT_MIN_PARTITIONS
    dead_letters: bool = True
    starting_offsets: str = "earliest"
    max_segments_per_trigger: int | None = None
    columns: tuple[str, ...] | None = None  # None: every column of the message schema

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, stream: bool = False) -> ReadConfig:
        check_options(options, "stream" if stream else "read", STREAM_OPTIONS if stream else READ_OPTIONS)
        opts = lower(options)
        if _bool(opts, "pushdown", False):
            raise ConfigError(
                "option pushdown=true is not supported: Spark reuses a scan planned with pushed filters for "
                "later queries of the same DataFrame, which would then return too few rows; narrow reads with "
                "the options partitions, startSeq/endSeq and since/until instead"
            )
        consumer = opts.get("consumer") or None
        if consumer is not None:
            validate_name(consumer, "consumer")
        partitions = None
        if opts.get("partitions"):
            try:
                partitions = frozenset(int(p) for p in opts["partitions"].split(",") if p.strip())
            except ValueError:
                raise ConfigError(f"option partitions={opts['partitions']!r}: use e.g. '0,2,3'") from None
        return cls(
            settings=resolve_settings(options),
            topic=_topic(opts),
            consumer=consumer,
            partitions=partitions,
            start_seq=_int(opts, "startSeq", 0) or 0,
            end_seq=_int(opts, "endSeq", None),
            since=parse_time(opts["since"], "since") if opts.get("since") else None,
            until=parse_time(opts["until"], "until") if opts.get("until") else None,
            split_bytes=_int(opts, "splitBytes", DEFAULT_SPLIT_BYTES, 1) or DEFAULT_SPLIT_BYTES,
            min_partitions=_int(opts, "minPartitions", DEFAULT_MIN_PARTITIONS, 1) or 1,
            dead_letters=_bool(opts, "deadLetters", True),
            starting_offsets=opts.get("startingoffsets", "earliest"),
            max_segments_per_trigger=_int(opts, "maxSegmentsPerTrigger", None, 1),
            columns=read_columns(opts, with_state=consumer is not None),
        )

    def wants_time(self, created_at: float) -> bool:
        """Whether a message created at ``created_at`` passes the since/until filter (to the microsecond)."""
        t = round(created_at * 1_000_000)
        if self.since is not None:
            lo = round(self.since * 1_000_000)
            if t < lo or (self.since_exclusive and t == lo):
                return False
        if self.until is not None:
            hi = round(self.until * 1_000_000)
            if t > hi or (not self.until_inclusive and t == hi):
                return False
        return True


@dataclass
class WriteConfig:
    """How a DataFrame is written into a topic (picklable; resolved on the driver)."""

    settings: dict[str, Any]
    topic: str
    job: str
    batch_messages: int = DEFAULT_BATCH_MESSAGES
    batch_bytes: int = DEFAULT_BATCH_BYTES
    payload_format: str = "json"  # json: a string payload column holds JSON text; string: a JSON string
    keep_ids: bool = True
    partitions: int = 1  # the topic's, read on the driver
    max_message_bytes: int = 256 * 1024
    producer_id: str = ""
    compression: str | None = "zstd"  # chunk buffer compression, None: uncompressed chunks
    txn_timeout_s: float = DEFAULT_TXN_TIMEOUT_S
    run: str = ""  # this write run (set on the driver): names its chunks
    incarnation: str = ""  # the topic's incarnation when the run started (set on the driver)
    done: dict[str, Any] | None = None  # the job was committed before: its report (tasks do nothing)
    fail_on_changed_input: bool = False  # a rerun of a committed job with other input fails

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> WriteConfig:
        check_options(options, "write", WRITE_OPTIONS)
        opts = lower(options)
        compression = opts.get("compression", "zstd").lower() or "zstd"
        if compression not in COMPRESSIONS:
            raise ConfigError(f"option compression={compression!r}: use one of {', '.join(COMPRESSIONS)}")
        changed = opts.get("changedinput", "warn").lower() or "warn"
        if changed not in CHANGED_INPUT:
            raise ConfigError(f"option changedInput={changed!r}: use warn or fail")
        timeout = _int(opts, "txnTimeout", int(DEFAULT_TXN_TIMEOUT_S), 10) or int(DEFAULT_TXN_TIMEOUT_S)
        fmt = opts.get("payloadformat", "json").lower()
        if fmt not in ("json", "string"):
            raise ConfigError(f"option payloadFormat={fmt!r}: use json or string")
        job = opts.get("jobid") or uuid.uuid4().hex
        if not job.replace("-", "").isalnum() or not job.isascii() or len(job) > 128:
            raise ConfigError(f"option jobId={job!r}: use up to 128 ASCII letters, digits and '-'")
        return cls(
            settings=resolve_settings(options),
            topic=_topic(opts),
            job=job,
            batch_messages=_batch_messages(opts),
            batch_bytes=_int(opts, "batchBytes", DEFAULT_BATCH_BYTES, 1024) or DEFAULT_BATCH_BYTES,
            payload_format=fmt,
            keep_ids=_bool(opts, "keepIds", True),
            compression=None if compression == "none" else "zstd",
            txn_timeout_s=float(timeout),
            fail_on_changed_input=changed == "fail",
        )


def read_columns(opts: Mapping[str, str], *, with_state: bool) -> tuple[str, ...] | None:
    """The ``columns`` option: the message columns a read returns, in the schema's order.

    A Python data source gets no column pruning from Spark (every query reads the whole schema),
    so a read that needs a few columns names them: only those are decoded and sent to Spark.
    """
    from bucketq.spark.schema import column_names

    text = lower(opts).get("columns", "")
    if not text.strip():
        return None
    wanted = [c.strip() for c in text.split(",") if c.strip()]
    known = column_names(with_state=with_state)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise ConfigError(
            f"option columns: unknown column(s) {', '.join(unknown)}; columns are {', '.join(known)}"
        )
    return tuple(c for c in known if c in wanted)


def offsets_json(topic: str, offsets: Mapping[int, int]) -> dict[str, Any]:
    """A streaming offset: ``{topic: {"partition": next segment seq}}`` (Kafka-style JSON)."""
    return {topic: {str(p): int(s) for p, s in sorted(offsets.items())}}


def parse_offsets(topic: str, offset: Mapping[str, Any] | str) -> dict[int, int]:
    """The per-partition next seqs of a streaming offset (dict or JSON text)."""
    obj = json.loads(offset) if isinstance(offset, str) else offset
    if not isinstance(obj, Mapping) or topic not in obj or not isinstance(obj[topic], Mapping):
        raise ConfigError(f"offset {obj!r} is not a bucketq offset of topic {topic!r}")
    try:
        return {int(p): int(s) for p, s in obj[topic].items()}
    except (TypeError, ValueError):
        raise ConfigError(f"offset {obj!r}: partitions and seqs must be integers") from None
