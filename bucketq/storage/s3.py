"""S3 adapter (aioboto3): any S3-compatible endpoint, conditional writes mapped to bucketq errors.

Retries happen in two layers. botocore retries each request ("standard" mode, ``max_attempts``
from the settings); on top of that :class:`S3Store` retries 5xx, SlowDown, timeouts and
connection errors a few more times with jittered exponential backoff, all inside one deadline
per operation, so a call never hangs. Until the endpoint has answered once, a connection
failure is reported at once (no retries): a wrong endpoint fails in milliseconds, a
black-holed one after the connect timeout.

A write whose response was lost may have landed: botocore then retries it, and a retried
``If-None-Match: *`` PUT answers 412 although the object holds our own bytes. The engine
handles that case by reading the object back.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import random
import threading
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import aioboto3
import aiohttp
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from bucketq.errors import (
    AlreadyExists,
    Contended,
    NotSupported,
    PreconditionFailed,
    StorageError,
    StorageTimeout,
)
from bucketq.storage.port import Blob, ObjectInfo, RequestStats

if TYPE_CHECKING:
    from bucketq.config import Settings

T = TypeVar("T")

_OPS = {
    "GetObject": "GET",
    "HeadObject": "HEAD",
    "HeadBucket": "HEAD",
    "PutObject": "PUT",
    "DeleteObjects": "DELETE",
    "ListObjectsV2": "LIST",
}
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
_DENIED_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidToken"}
)
_CONNECT_ERRORS = (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError)


_sessions = threading.local()


def _session_for(access_key_id: str | None, secret_access_key: str | None, region: str) -> Any:
    """This thread's aioboto3 session for these credentials, made once.

    Making a session loads botocore's data files (~0.1 CPU-second); a client made from a session
    that already has them costs ~0.006 s. Every store opened in a process (a Spark split, a CLI
    command, a sidecar's stores) shares it. Per thread, because botocore sessions are not
    thread-safe; across event loops, because a session holds no loop (each client does)."""
    cache: dict[tuple[str | None, str | None, str], Any] | None = getattr(_sessions, "by_credentials", None)
    if cache is None:
        cache = _sessions.by_credentials = {}
    key = (access_key_id, secret_access_key, region)
    session = cache.get(key)
    if session is None:
        session = cache[key] = aioboto3.Session(
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key, region_name=region
        )
    return session


def certificate_verification(endpoint_url: str | None) -> bool | None:
    """botocore's ``verify`` for a client of ``endpoint_url``: None (its default, verify) or False.

    False only where no TLS can happen: a plain ``http://`` endpoint with no proxy for it (a
    proxy may be reached over TLS, and its certificate must then be checked). Verifying makes
    every client load the CA bundle into a fresh SSL context when it opens its connection pool,
    ~30 CPU-ms a client, for a context a plain-HTTP endpoint never uses: every CLI command, Spark
    split and operator namespace against an in-cluster S3 server paid it."""
    if endpoint_url is None or urllib.parse.urlsplit(endpoint_url).scheme.lower() != "http":
        return None
    proxies = urllib.request.getproxies()
    if proxies.get("http") or proxies.get("all"):
        return None
    return False


@dataclass(slots=True)
class _Trace:
    """What botocore saw during one operation (read by the retry hook)."""

    fail_fast: bool
    last: str | None = None


_TRACE: contextvars.ContextVar[_Trace | None] = contextvars.ContextVar("bucketq_s3_trace", default=None)


def _no_date(endpoint: str, date: object = None) -> float:
    raise NotSupported(f"{endpoint} answered without a usable Date header ({date!r}): no store clock")


class _Retry(Exception):
    """Internal: the attempt failed with a transient error worth another try."""

    def __init__(self, error: StorageError) -> None:
        super().__init__(str(error))
        self.error = error


class S3Store:
    """:class:`~bucketq.storage.port.ObjectStore` over one S3 bucket.

    The aioboto3 client is created lazily inside the running event loop and kept open until
    :meth:`close`; pickling the store keeps only its configuration (a new client is made on
    first use after unpickling).
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        path_style: bool = True,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 15.0,
        max_attempts: int = 6,
        max_pool_connections: int = 64,
        retry_attempts: int = 3,
        retry_base_s: float = 0.1,
        retry_max_s: float = 2.0,
        op_timeout_s: float | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("S3Store needs a bucket name")
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region = region
        self.path_style = path_style
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_attempts = max_attempts
        self.max_pool_connections = max_pool_connections
        self.retry_attempts = max(1, retry_attempts)
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.op_timeout_s = op_timeout_s or (connect_timeout_s + read_timeout_s + 10.0)
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self.stats = RequestStats()
        self._reset_runtime()

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Store:
        """A store for ``settings.s3_*`` (the bucket must be set)."""
        if not settings.s3_bucket:
            raise StorageError("backend 's3' needs s3_bucket (env BUCKETQ_S3_BUCKET)")
        key_id = settings.s3_access_key_id
        secret = settings.s3_secret_access_key
        return cls(
            settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            access_key_id=key_id.get_secret_value() if key_id else None,
            secret_access_key=secret.get_secret_value() if secret else None,
            path_style=settings.s3_path_style,
            connect_timeout_s=settings.s3_connect_timeout_s,
            read_timeout_s=settings.s3_read_timeout_s,
            max_attempts=settings.s3_max_attempts,
            max_pool_connections=settings.s3_max_pool_connections,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def _reset_runtime(self) -> None:
        self._client: Any = None
        self._stack: AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._reached = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_client", "_stack", "_loop", "_lock", "_lock_loop", "_reached"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint={self.endpoint})"

    @property
    def endpoint(self) -> str:
        """The endpoint for messages: the URL, or AWS S3 with its region."""
        return self.endpoint_url or f"AWS S3 ({self.region})"

    async def _ensure_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            if self._client is not None and self._loop is not loop:
                # Made in another (finished) event loop: it cannot be used or closed from here.
                self._client, self._stack = None, None
            if self._client is None:
                session = _session_for(self._access_key_id, self._secret_access_key, self.region)
                config = Config(
                    region_name=self.region,
                    s3={"addressing_style": "path" if self.path_style else "auto"},
                    connect_timeout=self.connect_timeout_s,
                    read_timeout=self.read_timeout_s,
                    # total_max_attempts counts the first try (botocore's "max_attempts" would not).
                    retries={"mode": "standard", "total_max_attempts": self.max_attempts},
                    max_pool_connections=self.max_pool_connections,
                    # Third-party S3 servers often reject the default CRC32 trailers of new botocore.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    user_agent_extra="bucketq",
                )
                stack = AsyncExitStack()
                client = await stack.enter_async_context(
                    session.client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        config=config,
                        verify=certificate_verification(self.endpoint_url),
                    )
                )
                client.meta.events.register("before-send.s3", self._on_before_send)
                client.meta.events.register_first("needs-retry.s3", self._on_needs_retry)
                self._client, self._stack, self._loop = client, stack, loop
        return self._client

    async def close(self) -> None:
        stack, loop = self._stack, self._loop
        self._client, self._stack, self._loop = None, None, None
        if stack is not None and loop is asyncio.get_running_loop():
            await stack.aclose()

    # -- botocore hooks -----------------------------------------------------------------------

    def _on_before_send(self, request: Any, event_name: str = "", **_: Any) -> None:
        """Count every HTTP request botocore sends (its own retries included)."""
        op = _OPS.get(event_name.rsplit(".", 1)[-1], event_name.rsplit(".", 1)[-1])
        sent = 0
        if op == "PUT":
            try:
                sent = int(request.headers.get("Content-Length", 0))
            except (TypeError, ValueError):
                sent = 0
        self.stats.count(op, sent=sent)

    def _on_needs_retry(
        self, caught_exception: BaseException | None = None, response: Any = None, **_: Any
    ) -> None:
        """Remember what went wrong; before the endpoint ever answered, stop retrying connect errors."""
        trace = _TRACE.get()
        if trace is None:
            return
        if caught_exception is not None:
            trace.last = f"{type(caught_exception).__name__}: {caught_exception}"
            if trace.fail_fast and isinstance(caught_exception, _CONNECT_ERRORS):
                raise caught_exception
        elif response is not None:
            try:
                http, parsed = response
                code = parsed.get("Error", {}).get("Code", "")
                trace.last = f"HTTP {http.status_code} {code}".strip()
            except (TypeError, ValueError, AttributeError):
                pass

    # -- the retry loop -----------------------------------------------------------------------

    def _where(self, op: str, key: str) -> str:
        return f"{op} s3://{self.bucket}/{key} at {self.endpoint}"

    @staticmethod
    def _what(op: str, key: str) -> str:
        return f"{op} {key}" if key else f"{op} bucket"

    async def _call(self, op: str, key: str, fn: Callable[[Any], Awaitable[T]], **cond: Any) -> T:
        client = await self._ensure_client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.op_timeout_s
        trace = _Trace(fail_fast=not self._reached)
        token = _TRACE.set(trace)
        try:
            attempt = 0
            while True:
                attempt += 1
                timer = asyncio.timeout_at(deadline)
                try:
                    async with timer:
                        try:
                            result = await fn(client)
                        except ClientError as exc:
                            self._reached = True
                            raise self._client_error(exc, op, key, **cond) from None
                        except TimeoutError as exc:
                            if timer.expired():
                                raise
                            raise _Retry(
                                StorageTimeout(f"{self._where(op, key)}: timed out ({exc})")
                            ) from None
                        except (BotoCoreError, aiohttp.ClientError, OSError) as exc:
                            raise self._transport_error(exc, op, key, trace) from None
                    self._reached = True
                    return result
                except TimeoutError:
                    last = f" (last error: {trace.last})" if trace.last else ""
                    raise StorageTimeout(
                        f"{self._where(op, key)}: no answer within {self.op_timeout_s:g}s{last}"
                    ) from None
                except _Retry as retry:
                    if attempt >= self.retry_attempts:
                        raise retry.error from None
                    delay = min(self.retry_max_s, self.retry_base_s * 2 ** (attempt - 1))
                    delay *= random.uniform(0.5, 1.0)
                    if loop.time() + delay >= deadline:
                        raise retry.error from None
                    await asyncio.sleep(delay)
        finally:
            _TRACE.reset(token)

    def _client_error(
        self, exc: ClientError, op: str, key: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> Exception:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        message = str(err.get("Message", "")) or code
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        where = self._where(op, key)
        detail = f"HTTP {status} {message}" if code.isdigit() else f"{code}: {message}"
        if status == 412 or code == "PreconditionFailed":
            if if_none_match:
                return AlreadyExists(f"{key} already exists (412 on If-None-Match at {self.endpoint})")
            return PreconditionFailed(f"{key} changed (If-Match {if_match} failed at {self.endpoint})")
        if status == 409 and code == "ConditionalRequestConflict":
            return Contended(f"{key} is being written concurrently (409 {code} at {self.endpoint})")
        if code == "NoSuchBucket":
            return StorageError(
                f"bucket {self.bucket!r} does not exist at {self.endpoint} ({self._what(op, key)}): "
                "create it or fix s3_bucket"
            )
        if code == "NoSuchKey" and if_match is not None:
            return PreconditionFailed(f"{key} does not exist (If-Match {if_match} failed at {self.endpoint})")
        if (if_none_match or if_match is not None) and (status == 501 or code == "NotImplemented"):
            return NotSupported(
                f"{self.endpoint} does not support conditional writes ({where}: {code}: {message})"
            )
        if status == 403 or code in _DENIED_CODES:
            return StorageError(
                f"access denied to bucket {self.bucket!r} at {self.endpoint} ({self._what(op, key)}): {detail}; "
                "check s3_access_key_id / s3_secret_access_key and the bucket policy"
            )
        error = StorageError(f"{where}: {detail}" if code.isdigit() else f"{where}: HTTP {status} {detail}")
        if status >= 500 or code in _RETRYABLE_CODES:
            return _Retry(error)
        return error

    def _transport_error(self, exc: BaseException, op: str, key: str, trace: _Trace) -> Exception:
        if isinstance(exc, NoCredentialsError):
            return StorageError(
                f"{self._where(op, key)}: no S3 credentials found; set s3_access_key_id and "
                "s3_secret_access_key (or the usual AWS_* environment variables)"
            )
        if isinstance(exc, _CONNECT_ERRORS):
            error = StorageError(
                f"cannot reach S3 endpoint {self.endpoint} (bucket {self.bucket!r}, {self._what(op, key)}): {exc}"
            )
            return error if trace.fail_fast else _Retry(error)
        if isinstance(exc, (ReadTimeoutError, TimeoutError)):
            return _Retry(StorageTimeout(f"{self._where(op, key)}: timed out: {exc}"))
        if isinstance(exc, (HTTPClientError, BotoConnectionError, aiohttp.ClientError, OSError)):
            return _Retry(
                StorageError(f"{self._where(op, key)}: connection failed: {type(exc).__name__}: {exc}")
            )
        return StorageError(f"{self._where(op, key)}: {exc}")  # e.g. invalid parameters: not transient

    # -- ObjectStore --------------------------------------------------------------------------

    async def check(self) -> None:
        """Fail with a clear :class:`StorageError` unless the bucket exists and is reachable."""

        async def head_bucket(client: Any) -> None:
            try:
                await client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    self._reached = True
                    raise StorageError(
                        f"bucket {self.bucket!r} does not exist at {self.endpoint}: create it or fix s3_bucket"
                    ) from None
                raise

        await self._call("HEAD", "", head_bucket)

    async def now(self) -> float:
        """The store's clock: the ``Date`` header of a HEAD of the bucket (one request, whole
        seconds, the server's clock as in Last-Modified). :class:`NotSupported` when the answer
        carries no usable ``Date``."""

        async def head_bucket(client: Any) -> str | None:
            resp = await client.head_bucket(Bucket=self.bucket)
            headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            return headers.get("date") if isinstance(headers, dict) else None

        date = await self._call("HEAD", "", head_bucket)
        try:
            return parsedate_to_datetime(date).timestamp() if date else _no_date(self.endpoint)
        except (TypeError, ValueError):
            return _no_date(self.endpoint, date)

    async def get(self, key: str) -> Blob | None:
        async def fetch(client: Any) -> Blob | None:
            try:
                resp = await client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchKey":
                    return None
                raise
            async with resp["Body"] as body:
                data = await body.read()
            self.stats.bytes_in += len(data)
            return Blob(data, resp["ETag"], resp["LastModified"].timestamp())

        return await self._call("GET", key, fetch)

    async def head(self, key: str) -> ObjectInfo | None:
        async def fetch(client: Any) -> ObjectInfo | None:
            try:
                resp = await client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                # HEAD has no body: a missing bucket looks like a missing key (open_storage checks it).
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return None
                raise
            return ObjectInfo(key, int(resp["ContentLength"]), resp["ETag"], resp["LastModified"].timestamp())

        return await self._call("HEAD", key, fetch)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": bytes(data)}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match

        async def send(client: Any) -> str:
            resp = await client.put_object(**kwargs)
            return str(resp["ETag"])

        return await self._call("PUT", key, send, if_none_match=if_none_match, if_match=if_match)

    async def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            resp = await self._call("DELETE", batch[0], partial(self._delete_batch, batch))
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise StorageError(
                    f"DELETE in s3://{self.bucket} at {self.endpoint}: {len(errors)} of {len(batch)} keys "
                    f"not deleted, first {first.get('Key')!r}: {first.get('Code')}: {first.get('Message')}"
                )

    async def _delete_batch(self, batch: list[str], client: Any) -> dict[str, Any]:
        objects = [{"Key": k} for k in batch]
        resp: dict[str, Any] = await client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
        )
        return resp

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        after = start_after
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if after:
                kwargs["StartAfter"] = after
            page = await self._call("LIST", prefix, partial(self._list_page, kwargs))
            contents = page.get("Contents") or []
            for obj in contents:
                yield ObjectInfo(obj["Key"], int(obj["Size"]), obj["ETag"], obj["LastModified"].timestamp())
            if not page.get("IsTruncated") or not contents:
                return
            after = contents[-1]["Key"]

    async def list_prefixes(self, prefix: str, delimiter: str = "/") -> builtins.list[str]:
        """The common prefixes one level below ``prefix`` (``ListObjectsV2`` with a delimiter).

        Some servers (SeaweedFS) keep reporting a "directory" after its last object is deleted,
        so every prefix is confirmed with a one-key LIST: an admin path, not a hot one.
        """
        found: builtins.list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": delimiter}
            if token:
                kwargs["ContinuationToken"] = token
            page = await self._call("LIST", prefix, partial(self._list_page, kwargs))
            found.extend(p["Prefix"] for p in page.get("CommonPrefixes") or [])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        limit = asyncio.Semaphore(16)

        async def nonempty(candidate: str) -> bool:
            async with limit:
                kwargs = {"Bucket": self.bucket, "Prefix": candidate, "MaxKeys": 1}
                page = await self._call("LIST", candidate, partial(self._list_page, kwargs))
                return bool(page.get("Contents"))

        candidates = sorted(set(found))
        keep = await asyncio.gather(*(nonempty(c) for c in candidates))
        return [c for c, ok in zip(candidates, keep, strict=True) if ok]

    @staticmethod
    async def _list_page(kwargs: dict[str, Any], client: Any) -> dict[str, Any]:
        page: dict[str, Any] = await client.list_objects_v2(**kwargs)
        return page
