"""``Bucketq``: the library entry point (topics, producers, consumers, stats) over one bucket."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Self

from bucketq.config import ConsumerSettings, ProducerSettings, Settings
from bucketq.core.bucket_format import FORMAT, UPGRADABLE_FORMATS, ensure_format  # noqa: F401 (re-exported)
from bucketq.core.consumer import Consumer
from bucketq.core.gc import GcReport, collect_garbage
from bucketq.core.keys import Keys, validate_name
from bucketq.core.models import DeadLetterConfig, TopicConfig, TopicMarker
from bucketq.core.peek import PeekedMessage, peek
from bucketq.core.pings import PingNetwork, Pings
from bucketq.core.producer import Producer, PublishResult
from bucketq.core.producer_peers import ProducerPeers
from bucketq.core.redrive import RedriveReport, redrive
from bucketq.core.registry import Registry
from bucketq.core.stats import SubscriptionStats, subscription_stats
from bucketq.core.subscriptions import (
    SeekTarget,
    delete_subscription,
    init_subscription,
    seek_subscription,
)
from bucketq.core.topics import TopicCatalog, TopicInfo
from bucketq.core.udp_pings import udp_pings
from bucketq.errors import BucketqError, ConfigError
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
    def from_env(cls, **overrides: Any) -> Bucketq:
        """From ``BUCKETQ_*`` environment variables; keyword overrides win."""
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
        network = self._ping_network
        if network is None and self.settings.ping.enabled:
            network = await udp_pings(self.settings)
        self._pings = Pings(network if self.settings.ping.enabled else None, self._storage, self.keys)
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

    async def register_producer(self, name: str = "default", **overrides: Any) -> Producer:
        """A producer registered under ``name`` (stable id); ``overrides`` tune its ProducerSettings."""
        reg = await self._registry.register("producer", name)
        settings = (
            self.settings.producer.model_copy(update=overrides) if overrides else self.settings.producer
        )
        ProducerSettings.model_validate(settings.model_dump())
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
        )
        self._producers.append(producer)
        return producer

    async def register_consumer(
        self,
        name: str,
        topics: list[str] | str,
        *,
        start_position: Literal["earliest", "latest"] | None = None,
        **overrides: Any,
    ) -> Consumer:
        """Join consumer group ``name`` over ``topics`` and start prefetching."""
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        if not topic_list:
            raise ConfigError("a consumer needs at least one topic")
        for t in topic_list:
            await self.catalog.config(t)  # raises TopicNotFound early
        if start_position is not None:
            overrides["start_position"] = start_position
        try:
            settings = ConsumerSettings.model_validate({**self.settings.consumer.model_dump(), **overrides})
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
            )
            self._producers.append(self._default_producer)
        return self._default_producer

    async def publish(self, topic: str, payload: Any = None, **kwargs: Any) -> PublishResult:
        """Publish through this connection's shared default producer."""
        return await self._dlq_producer().publish(topic, payload, **kwargs)

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

    async def collect_garbage(self, topics: list[str] | None = None, **options: Any) -> GcReport:
        """Retention and garbage collection (docs/design.md 2.5); see :func:`bucketq.core.gc.collect_garbage`."""
        return await collect_garbage(self.storage, self.keys, topics=topics, **options)

    # -- looking at messages and moving dead letters ---------------------------------------------

    async def peek(self, topic: str, **options: Any) -> list[PeekedMessage]:
        """Read messages without leasing them or counting a delivery; see :func:`bucketq.core.peek.peek`."""
        return await peek(self.storage, self.keys, self.catalog, topic, **options)

    async def redrive(self, dlq: str, **options: Any) -> RedriveReport:
        """Move pending dead letters back, idempotently; see :func:`bucketq.core.redrive.redrive`."""
        return await redrive(self, dlq, **options)

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

    def producer(self, **settings: Any) -> BucketqBuilder:
        self._data["producer"].update(settings)
        return self

    def consumer(self, **settings: Any) -> BucketqBuilder:
        self._data["consumer"].update(settings)
        return self

    def settings(self) -> Settings:
        return Settings.from_dict(self._data)

    def build(self, *, store: ObjectStore | None = None) -> Bucketq:
        return Bucketq(self.settings(), store=store)
