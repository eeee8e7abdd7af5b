"""``Bucketq``: the library entry point (topics, producers, consumers, stats) over one bucket."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Self, Unpack

from bucketq.config import (
    ConsumerOverrides,
    ConsumerSettings,
    ConsumerTuning,
    ProducerOverrides,
    ProducerSettings,
    Settings,
    SettingsOverrides,
)
from bucketq.core.bucket_format import FORMAT, UPGRADABLE_FORMATS, ensure_format  # noqa: F401 (re-exported)
from bucketq.core.consumer import Consumer
from bucketq.core.fences import DELTA_GRACE_S, SEGMENT_GRACE_S
from bucketq.core.gc import GcReport, collect_garbage
from bucketq.core.keys import Keys, validate_name
from bucketq.core.models import DeadLetterConfig, TopicConfig, TopicMarker
from bucketq.core.peek import PeekedMessage, peek
from bucketq.core.pings import PingNetwork, Pings
from bucketq.core.producer import Producer, PublishResult
from bucketq.core.producer_peers import ProducerPeers
from bucketq.core.redrive import RedriveFilter, RedriveReport, redrive
from bucketq.core.registry import Registry
from bucketq.core.stats import SubscriptionStats, subscription_stats
from bucketq.core.store_clock import StoreClock
from bucketq.core.subscriptions import (
    SeekTarget,
    delete_subscription,
    init_subscription,
    seek_subscription,
)
from bucketq.core.topics import TopicCatalog, TopicInfo
from bucketq.core.udp_pings import udp_pings
from bucketq.errors import BucketqError, ConfigError, StorageError
from bucketq.publish_options import PublishFields, PublishOptions
from bucketq.storage import ObjectStore, Storage, open_storage

log = logging.getLogger("bucketq")


class Bucketq:
    """A connection to one bucket (and root prefix). Use as ``async with Bucketq(settings) as bq``."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        store: ObjectStore | None = None,
        ping_network: PingNetwork | None = None,
    ) -> None:
        self.settings = settings or Settings.load()
        self._store = store
        # the wake pings' network (core/pings.py): UDP as the settings say unless one is given
        self._ping_network = ping_network
        self._pings: Pings | None = None
        self._storage: Storage | None = None
        self.keys = Keys(self.settings.root)
        self._producers: list[Producer] = []
        self._consumers: list[Consumer] = []
        self._default_producer: Producer | None = None

    # -- constructors ----------------------------------------------------------------------------

    @classmethod
    def from_env(cls, **overrides: Unpack[SettingsOverrides]) -> Bucketq:
        """From ``BUCKETQ_*`` environment variables; keyword overrides (:class:`~bucketq.Settings`
        fields) win. Raises :class:`~bucketq.ConfigError`."""
        return cls(Settings.load(**overrides))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bucketq:
        return cls(Settings.from_dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> Bucketq:
        return cls(Settings.from_yaml(path))

    @classmethod
    def builder(cls) -> BucketqBuilder:
        return BucketqBuilder()

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            raise BucketqError("Bucketq is not open: use 'async with Bucketq(...)' or 'await bq.open()'")
        return self._storage

    @property
    def catalog(self) -> TopicCatalog:
        """Topic markers and configs."""
        self.storage  # noqa: B018  (raises when not open)
        return self._catalog

    @property
    def clock(self) -> StoreClock:
        """The store's clock as this connection reads it; ``clock.offset_s`` is this host's clock
        minus the store's at the last reading, ``clock.warnings`` how often it was beyond the
        margin (docs/protocol.md, I15)."""
        self.storage  # noqa: B018
        return self._clock

    @property
    def registry(self) -> Registry:
        """Named producers and consumers with stable ids."""
        self.storage  # noqa: B018
        return self._registry

    async def open(self) -> Self:
        """Connect, choose the concurrency strategy, and check the bucket's format marker."""
        if self._storage is not None:
            return self
        self._storage = await open_storage(self.settings, store=self._store, root=self.settings.root)
        self._catalog = TopicCatalog(self._storage, self.keys)
        self._registry = Registry(self._storage, self.keys)
        await self._bootstrap()
        # the store's clock (I15): this process's ages that decide takeovers are measured on it,
        # and this host's clock is compared with it once now (a warning when beyond the margin)
        self._clock = StoreClock(
            self._storage, keys=self.keys, margin_s=self.settings.consumer.clock_skew_s, who="bucketq"
        )
        try:
            await self._clock.read()
        except StorageError as exc:  # a diagnostic: the store answered everything else
            log.warning("could not compare this host's clock with the store's: %s", exc)
        network = self._ping_network
        if network is None and self.settings.ping.enabled:
            network = await udp_pings(self.settings)
        self._pings = Pings(
            network if self.settings.ping.enabled else None,
            self._storage,
            self.keys,
            member_ttl_s=self.settings.consumer.member_ttl_s,
        )
        return self

    async def _bootstrap(self) -> None:
        await ensure_format(self.storage, self.keys)

    async def close(self) -> None:
        """Close consumers (draining), flush producers, release connections."""
        for consumer in self._consumers:
            await consumer.close()
        for producer in self._producers:
            await producer.close()
        if self._pings is not None:
            self._pings.close()
            self._pings = None
        if self._storage is not None:
            await self._storage.close()
            self._storage = None

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def strategy(self) -> str:
        return self.storage.strategy

    # -- topics ----------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        retention_seconds: float | None = None,
        max_message_bytes: int | None = None,
        dead_letter: DeadLetterConfig | dict[str, Any] | None = None,
        config: TopicConfig | None = None,
    ) -> TopicMarker:
        """Create a topic; idempotent (an existing topic is returned unchanged)."""
        validate_name(name)
        if config is None:
            fields: dict[str, Any] = {
                "partitions": partitions,
                "retention_seconds": retention_seconds,
                "max_message_bytes": max_message_bytes,
                "dead_letter": dead_letter,
            }
            try:
                config = TopicConfig(**{k: v for k, v in fields.items() if v is not None})
            except ValueError as exc:
                raise ConfigError(f"invalid topic config for {name!r}: {exc}") from None
        marker, _ = await self.catalog.create(name, config)
        return marker

    async def update_topic(self, name: str, config: TopicConfig) -> TopicMarker:
        """Change a topic's config (partitions may only grow)."""
        return await self.catalog.update(name, config)

    async def list_topics(self) -> list[str]:
        return await self.catalog.names()

    async def describe_topic(self, name: str) -> TopicInfo:
        return await self.catalog.describe(name)

    async def delete_topic(
        self, name: str, *, purge: bool = True, progress: Callable[[int], None] | None = None
    ) -> int:
        """Delete the topic's marker and, with purge, all its objects. Returns objects deleted;
        ``progress`` hears how many objects each batch deleted."""
        return await self.catalog.delete(name, purge=purge, progress=progress)

    # -- producers and consumers -----------------------------------------------------------------

    async def register_producer(
        self,
        name: str = "default",
        *,
        linger_ms: float | None = None,
        linger_fill_messages: int | None = None,
        max_batch_messages: int | None = None,
        max_batch_bytes: int | None = None,
        max_attempts: int | None = None,
        publish_timeout_s: float | None = None,
        dedup_window_s: float | None = None,
    ) -> Producer:
        """A producer registered under ``name``: a stable id, and a share of the partitions split
        with the other live producers (unkeyed publishes).

        The keyword arguments override this connection's :class:`~bucketq.ProducerSettings` for
        this producer (``None``: the connection's value): ``linger_ms`` (the most a batch waits for
        company), ``linger_fill_messages`` (a batch this full stops lingering),
        ``max_batch_messages`` and ``max_batch_bytes`` (a segment's limits),
        ``max_attempts`` (segment writes before a publish fails), ``publish_timeout_s``, and
        ``dedup_window_s`` (how long a ``dedup_id`` is remembered). Raises
        :class:`~bucketq.ConfigError` for a value out of range.
        """
        overrides = {
            k: v
            for k, v in {
                "linger_ms": linger_ms,
                "linger_fill_messages": linger_fill_messages,
                "max_batch_messages": max_batch_messages,
                "max_batch_bytes": max_batch_bytes,
                "max_attempts": max_attempts,
                "publish_timeout_s": publish_timeout_s,
                "dedup_window_s": dedup_window_s,
            }.items()
            if v is not None
        }
        try:
            settings = ProducerSettings.model_validate({**self.settings.producer.model_dump(), **overrides})
        except ValueError as exc:
            raise ConfigError(f"invalid producer settings: {exc}") from None
        reg = await self._registry.register("producer", name)
        peers = ProducerPeers(self.storage, self.keys, self.registry, reg)
        await peers.refresh(heartbeat=False)  # register() just wrote the registration
        producer = Producer(
            self.storage,
            self.keys,
            self.catalog,
            settings,
            producer_id=reg.id,
            name=name,
            peers=peers,
            pings=self._pings,
            clock=self._clock,
        )
        self._producers.append(producer)
        return producer

    async def register_consumer(
        self,
        name: str,
        topics: list[str] | str,
        *,
        start_position: Literal["earliest", "latest"] | None = None,
        **overrides: Unpack[ConsumerTuning],
    ) -> Consumer:
        """Join consumer group ``name`` over ``topics`` and start prefetching; returns once every
        partition's cursor has started (I5).

        ``start_position``: where a new subscription starts (default: the settings'). The other
        keyword arguments override this connection's :class:`~bucketq.ConsumerSettings` fields for
        this member (``visibility_timeout_s``, ``max_in_flight``, ``ordered``, ...). Raises
        :class:`~bucketq.TopicNotFound`, :class:`~bucketq.ConfigError` for bad settings.
        """
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        if not topic_list:
            raise ConfigError("a consumer needs at least one topic")
        for t in topic_list:
            await self.catalog.config(t)  # raises TopicNotFound early
        fields: dict[str, Any] = {**self.settings.consumer.model_dump(), **overrides}
        if start_position is not None:
            fields["start_position"] = start_position
        try:
            settings = ConsumerSettings.model_validate(fields)
        except ValueError as exc:
            raise ConfigError(f"invalid consumer settings: {exc}") from None
        reg = await self._registry.register("consumer", name, topics=topic_list)
        consumer = Consumer(
            self.storage,
            self.keys,
            self.catalog,
            self._dlq_producer(),
            settings,
            name=name,
            consumer_id=reg.id,
            topics=topic_list,
            pings=self._pings,
        )
        await consumer.start()
        self._consumers.append(consumer)
        return consumer

    def _dlq_producer(self) -> Producer:
        if self._default_producer is None:
            self._default_producer = Producer(
                self.storage,
                self.keys,
                self.catalog,
                self.settings.producer,
                producer_id="dead-letter",
                name="dead-letter",
                pings=self._pings,
                clock=self._clock,
            )
            self._producers.append(self._default_producer)
        return self._default_producer

    async def publish(
        self,
        topic: str,
        payload: Any = None,
        *,
        data: bytes | None = None,
        options: PublishOptions | None = None,
        **fields: Unpack[PublishFields],
    ) -> PublishResult:
        """Publish one message through this connection's shared default producer; returns once it
        is durable. The arguments and errors are :meth:`Producer.publish`'s: a JSON ``payload`` or
        raw ``data``, and the options of :class:`~bucketq.PublishOptions` as keyword arguments or
        as one ``options`` value."""
        return await self._dlq_producer().publish(topic, payload, data=data, options=options, **fields)

    async def init_subscription(
        self, topic: str, consumer: str, start_position: Literal["earliest", "latest"] = "earliest"
    ) -> list[int]:
        """Create ``consumer``'s cursors on every partition of ``topic`` (idempotent)."""
        return await init_subscription(self.storage, self.keys, topic, consumer, start_position)

    async def seek(
        self, topic: str, consumer: str, to: SeekTarget, *, partitions: list[int] | None = None
    ) -> dict[int, tuple[int, int]]:
        """Move a subscription to ``to`` (every member agrees); see :func:`seek_subscription`."""
        return await seek_subscription(self.storage, self.keys, topic, consumer, to, partitions=partitions)

    async def delete_subscription(self, topic: str, consumer: str) -> int:
        """Delete ``consumer``'s cursors on ``topic``; returns objects deleted."""
        return await delete_subscription(self.storage, self.keys, topic, consumer)

    async def collect_garbage(
        self,
        topics: list[str] | None = None,
        *,
        member_ttl_s: float = 300.0,
        dedup_window_s: float = 3600.0,
        claim_timeout_s: float = 30.0,
        delta_grace_s: float = DELTA_GRACE_S,
        segment_grace_s: float = SEGMENT_GRACE_S,
        now: float | None = None,
    ) -> GcReport:
        """Retention and garbage collection of ``topics`` (default: every topic) and the
        bucket-wide leftovers (docs/protocol.md); see :func:`bucketq.core.gc.collect_garbage`.

        ``member_ttl_s``: member heartbeats older than this are deleted (and none older counts a
        group as live). ``dedup_window_s``: dedup markers older than this are deleted (use the
        producers' window). ``claim_timeout_s``: csprng claim objects older than this are deleted.
        ``delta_grace_s``, ``segment_grace_s``: how old a fence must be, on the store's clock,
        before what is below it is freed (I1; shorter than the defaults only in tests).
        ``now``: the unix time ages are measured against (default: the clock).
        """
        return await collect_garbage(
            self.storage,
            self.keys,
            topics=topics,
            member_ttl_s=member_ttl_s,
            dedup_window_s=dedup_window_s,
            claim_timeout_s=claim_timeout_s,
            delta_grace_s=delta_grace_s,
            segment_grace_s=segment_grace_s,
            now=now,
        )

    # -- looking at messages and moving dead letters ---------------------------------------------

    async def peek(
        self,
        topic: str,
        *,
        limit: int = 10,
        partitions: list[int] | None = None,
        offset: int | None = None,
        since: float | None = None,
        consumer: str | None = None,
        include_done: bool = False,
    ) -> list[PeekedMessage]:
        """Up to ``limit`` messages of ``topic``, read without leasing them or counting a delivery
        (oldest first per partition, merged by creation time); see :func:`bucketq.core.peek.peek`.

        ``partitions``: only these (default: all). Start at a partition ``offset`` or at the
        first message created at or after ``since`` (unix time), not both; default: the oldest
        message kept. ``consumer``: start at that subscription's window and give each message
        its state for it (done messages only with ``include_done``). Raises
        :class:`~bucketq.TopicNotFound`, :class:`~bucketq.InvalidArgument` for a bad limit,
        offset or partition, :class:`~bucketq.StorageError`.
        """
        return await peek(
            self.storage,
            self.keys,
            self.catalog,
            topic,
            limit=limit,
            partitions=partitions,
            offset=offset,
            since=since,
            consumer=consumer,
            include_done=include_done,
        )

    async def redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        where: RedriveFilter | None = None,
        rate: float | None = None,
        limit: int | None = None,
        batch: int = 100,
        lease_s: float = 600.0,
        progress: Callable[[int], None] | None = None,
    ) -> RedriveReport:
        """Move the pending dead letters of ``dlq`` back, resumably and idempotently; see
        :func:`bucketq.core.redrive.redrive`.

        ``to``: the target topic (default: each message's source topic). ``where``: which dead
        letters (source topic, consumer, reason). ``rate``: publishes per second at most;
        ``limit``: messages moved by this run at most; ``batch``: messages claimed at a time,
        each for ``lease_s`` seconds; ``progress`` hears each batch's count. Raises
        :class:`~bucketq.TopicNotFound`, :class:`~bucketq.InvalidArgument` for a bad batch or rate
        or a message without a source topic when ``to`` is not given.
        """
        return await redrive(
            self,
            dlq,
            to=to,
            where=where,
            rate=rate,
            limit=limit,
            batch=batch,
            lease_s=lease_s,
            progress=progress,
        )

    # -- stats -----------------------------------------------------------------------------------

    async def stats(self, topic: str | None = None, consumer: str | None = None) -> list[SubscriptionStats]:
        """Backlog, in flight, dead-lettered and oldest age per topic and consumer."""
        topics = [topic] if topic else await self.list_topics()
        out = []
        for t in topics:
            consumers = [consumer] if consumer else await self.catalog.consumers(t)
            for c in consumers:
                out.append(await subscription_stats(self.storage, self.keys, self.catalog, t, c))
        return out


class BucketqBuilder:
    """Fluent construction: ``Bucketq.builder().s3(bucket="q", endpoint_url=...).linger_ms(5).build()``."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {"producer": {}, "consumer": {}, "csprng": {}}

    def s3(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ) -> BucketqBuilder:
        self._data.update(backend="s3", s3_bucket=bucket)
        for k, v in {
            "s3_endpoint_url": endpoint_url,
            "s3_region": region,
            "s3_access_key_id": access_key_id,
            "s3_secret_access_key": secret_access_key,
        }.items():
            if v is not None:
                self._data[k] = v
        return self

    def filesystem(self, path: str | Path) -> BucketqBuilder:
        self._data.update(backend="file", file_path=str(path))
        return self

    def memory(self) -> BucketqBuilder:
        self._data["backend"] = "memory"
        return self

    def root(self, prefix: str) -> BucketqBuilder:
        self._data["root"] = prefix
        return self

    def strategy(self, name: str) -> BucketqBuilder:
        self._data["strategy"] = name
        return self

    def producer(self, **settings: Unpack[ProducerOverrides]) -> BucketqBuilder:
        """Set :class:`~bucketq.ProducerSettings` fields."""
        self._data["producer"].update(settings)
        return self

    def consumer(self, **settings: Unpack[ConsumerOverrides]) -> BucketqBuilder:
        """Set :class:`~bucketq.ConsumerSettings` fields."""
        self._data["consumer"].update(settings)
        return self

    def settings(self) -> Settings:
        return Settings.from_dict(self._data)

    def build(self, *, store: ObjectStore | None = None) -> Bucketq:
        return Bucketq(self.settings(), store=store)
