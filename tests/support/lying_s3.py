"""A deliberately broken S3 store: an HTTP proxy in front of a real S3 server (moto, which checks
no signatures) that breaks one promise the protocol relies on, as some S3-compatible stores do.

``LyingS3(upstream, **faults)`` runs in its own thread (its own event loop) on 127.0.0.1:

* ``racy_create``: ``If-None-Match: *`` is checked with a HEAD, then the PUT goes up without the
  header after ``race_window_s``: a lone second PUT still answers 412 (a sequential probe finds
  the store fine), racing writers all win and the last one's bytes stay;
* ``ignore_if_match``: ``If-Match`` is dropped: a stale ETag overwrites;
* ``clock_skew_s``: every ``Last-Modified`` and ``Date`` header and ``<LastModified>`` in listings
  is shifted by that many seconds (a store whose clock is off);
* ``stale_reads_s``: a key PUT less than that long ago is not found by GET or HEAD and is missing
  from listings (a store that is only eventually consistent).

Every other promise is kept, including one moto itself does not keep: moto checks a conditional
PUT's precondition and stores the object in two steps with no lock between them, so racing
writers can both win on a loaded machine. The proxy sends the conditional PUTs of one key up one
at a time, so the only broken promise is the one asked for (the store checks compare verdicts
check by check).

Use it as a context manager; ``url`` is its endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import re
import threading
import time
from collections import defaultdict
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.servers import free_ports

HOP = {"host", "content-length", "transfer-encoding", "connection"}
PRECONDITION_FAILED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed</Code>'
    b"<Message>At least one of the pre-conditions you specified did not hold</Message></Error>"
)
_LAST_MODIFIED_XML = re.compile(rb"<LastModified>([^<]+)</LastModified>")
_LISTED = re.compile(rb"<Contents>.*?</Contents>", re.DOTALL)
_LISTED_KEY = re.compile(rb"<Key>([^<]*)</Key>")


class LyingS3:
    """See the module docstring."""

    def __init__(
        self,
        upstream: str,
        *,
        racy_create: bool = False,
        race_window_s: float = 0.2,
        ignore_if_match: bool = False,
        clock_skew_s: float = 0.0,
        stale_reads_s: float = 0.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.racy_create = racy_create
        self.race_window_s = race_window_s
        self.ignore_if_match = ignore_if_match
        self.clock_skew_s = clock_skew_s
        self.stale_reads_s = stale_reads_s
        self.written: dict[str, float] = {}  # path -> when a PUT of it last went up
        # path -> held while a conditional PUT of it is at the upstream (see the module docstring)
        self._conditional: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="lying-s3", daemon=True)

    def __enter__(self) -> LyingS3:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the lying S3 proxy did not start")
        return self

    def __exit__(self, *_: Any) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _main(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            self._session = session
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    # -- forwarding ------------------------------------------------------------------------------

    async def _forward(
        self, request: web.Request, headers: dict[str, str], body: bytes, method: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        async with self._session.request(
            method or request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
            if (method or request.method) == "HEAD" and "Content-Length" in upstream.headers:
                out["Content-Length"] = upstream.headers["Content-Length"]  # a HEAD has no body to count
            return upstream.status, out, payload

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        is_list = request.method == "GET" and "list-type" in request.query
        if request.method == "PUT" and not request.query:
            return await self._put(request, headers, body)
        if request.method in ("GET", "HEAD") and not is_list and self._fresh(request.path):
            return web.Response(status=404, body=b"" if request.method == "HEAD" else _no_such_key())
        status, out, payload = await self._forward(request, headers, body)
        if is_list and self.stale_reads_s:
            payload = self._hide_fresh(request.path, payload)
        return self._answer(status, out, payload)

    async def _put(self, request: web.Request, headers: dict[str, str], body: bytes) -> web.StreamResponse:
        if self.ignore_if_match:
            headers = {k: v for k, v in headers.items() if k.lower() != "if-match"}
        if self.racy_create and headers.get("If-None-Match") == "*":
            headers = {k: v for k, v in headers.items() if k.lower() != "if-none-match"}
            status, _, _ = await self._forward(request, headers, b"", method="HEAD")
            if status == 200:
                return web.Response(status=412, body=PRECONDITION_FAILED, content_type="application/xml")
            await asyncio.sleep(self.race_window_s)  # check, then act: the window racing writers share
        self.written[request.path] = time.monotonic()
        conditional = any(k.lower() in ("if-none-match", "if-match") for k in headers)
        async with self._conditional[request.path] if conditional else contextlib.nullcontext():
            status, out, payload = await self._forward(request, headers, body)
        return self._answer(status, out, payload)

    # -- the lies --------------------------------------------------------------------------------

    def _fresh(self, path: str) -> bool:
        put = self.written.get(path)
        return bool(self.stale_reads_s) and put is not None and time.monotonic() - put < self.stale_reads_s

    def _hide_fresh(self, path: str, payload: bytes) -> bytes:
        bucket = "/" + path.strip("/").split("/", 1)[0]

        def keep(match: re.Match[bytes]) -> bytes:
            key = _LISTED_KEY.search(match.group(0))
            listed = f"{bucket}/{key.group(1).decode()}" if key else ""
            return b"" if self._fresh(listed) else match.group(0)

        return _LISTED.sub(keep, payload)

    def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> web.Response:
        if self.clock_skew_s:
            for name in ("Last-Modified", "Date"):
                if name in headers:
                    headers[name] = _shift_http_date(headers[name], self.clock_skew_s)
            payload = _LAST_MODIFIED_XML.sub(
                lambda m: b"<LastModified>%s</LastModified>" % _shift_iso(m.group(1), self.clock_skew_s),
                payload,
            )
        if "Content-Length" in headers:  # a HEAD's: the size of the object, not of this body
            return web.Response(status=status, headers=headers)
        return web.Response(status=status, headers=headers, body=payload)


def _no_such_key() -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code>'
        b"<Message>The specified key does not exist.</Message></Error>"
    )


def _shift_http_date(value: str, seconds: float) -> str:
    shifted = email.utils.parsedate_to_datetime(value) + datetime.timedelta(seconds=seconds)
    return email.utils.format_datetime(shifted.astimezone(datetime.UTC), usegmt=True)


def _shift_iso(value: bytes, seconds: float) -> bytes:
    parsed = datetime.datetime.fromisoformat(value.decode().replace("Z", "+00:00"))
    shifted = parsed + datetime.timedelta(seconds=seconds)
    return shifted.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z").encode()
