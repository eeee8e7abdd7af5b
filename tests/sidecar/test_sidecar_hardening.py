"""Hardening of the sidecar against hostile or broken clients (issue "Hardening").

Each test runs a real sidecar process; most on the file backend (no S3 server needed), the outage
test on moto behind a TCP proxy that cuts the bucket off.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bucketq import Bucketq
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, SidecarProc, create_topics, eventually
from tests.support.servers import S3Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e]

MiB = 1024 * 1024


def file_settings(tmp_path: Path) -> Settings:
    return Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )


def file_sidecar(sidecars: SidecarFactory, settings: Settings, name: str, **options: Any) -> SidecarProc:
    return sidecars(settings, name, BUCKETQ_FILE_PATH=str(settings.file_path), **options)


def post(sc: SidecarProc, path: str, body: bytes, timeout: float = 30) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        sc.url + path, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# -- 1. memory ------------------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux: ``5`` into clear_refs); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


HOSTILE_BODIES: list[tuple[str, bytes, set[int]]] = [
    # ~600,000 tiny entries in 8 MiB: parsed whole this took +500 MiB before the batch check
    (
        "/v1/publish/mem/batch",
        b'{"messages":[' + b",".join([b'{"payload":0}'] * 590_000) + b"]}",
        {413},
    ),
    # 2 million receipts in one ack batch
    ("/v1/ack/batch", b'{"receipts":[' + b",".join([b'"a"'] * 2_000_000) + b"]}", {413}),
    # millions of empty objects, the densest Python objects per byte of JSON
    ("/v1/publish/mem", b'{"payload":[' + b",".join([b"{}"] * 2_700_000) + b"]}", {413}),
    # commas inside one string are no values: parsed (cheap), then too large for the topic
    ("/v1/publish/mem", b'{"payload":"' + b"ab," * 2_700_000 + b'"}', {413}),
    # 100,000-deep nesting (too many values already), and 900 deep (within the value budget)
    ("/v1/publish/mem", b'{"payload":' + b"[" * 100_000 + b"]" * 100_000 + b"}", {400, 413}),
    ("/v1/publish/mem", b'{"payload":' + b"[" * 900 + b"]" * 900 + b"}", {400}),
    # an integer over 4,300 digits
    ("/v1/publish/mem", b'{"payload":' + b"7" * 5000 + b"}", {400}),
]


async def test_hostile_bodies_raise_peak_memory_by_at_most_64_mib(
    tmp_path: Path, sidecars: SidecarFactory
) -> None:
    settings = file_settings(tmp_path)
    await create_topics(settings, "mem")
    sc = file_sidecar(sidecars, settings, "mem", consumer="c", topics="mem")
    pid = sc.process.pid
    assert post(sc, "/v1/publish/mem", b'{"payload": 1}')[0] == 200  # warm up every code path once
    assert post(sc, "/v1/publish/mem", b'{"payload": ' + b"[1]" + b"}")[0] == 200
    assert post(sc, "/v1/publish/mem/batch", b'{"messages":[{"payload":0}]}')[0] == 200
    exact = _reset_peak(pid)
    baseline = _status_kib(pid, "VmRSS" if exact else "VmHWM")

    slowest_probe = 0.0
    stop = threading.Event()

    def probe() -> None:  # /healthz must keep answering while the bodies are handled
        nonlocal slowest_probe
        while not stop.is_set():
            started = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/healthz", timeout=10):
                pass
            slowest_probe = max(slowest_probe, time.monotonic() - started)
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        for path, body, expected in HOSTILE_BODIES:
            assert len(body) <= 8 * MiB, "each body is within the default body limit"
            status, answer = post(sc, path, body)
            assert status in expected, (path, status, answer)
            assert set(answer) >= {"error", "message"}
            peak = _status_kib(pid, "VmHWM")
            assert peak - baseline <= 64 * 1024, f"{path}: peak RSS grew by {(peak - baseline) // 1024} MiB"
    finally:
        stop.set()
        prober.join(timeout=15)
    assert slowest_probe < 2.0, f"/healthz took {slowest_probe:.2f}s while hostile bodies were parsed"
    assert sc.process.poll() is None


# -- 2. settlements are checked locally -----------------------------------------------------------


async def test_forged_settlements_cost_no_bucket_request(tmp_path: Path, sidecars: SidecarFactory) -> None:
    settings = file_settings(tmp_path)
    await create_topics(settings, "forged")
    sc = file_sidecar(
        sidecars,
        settings,
        "forged",
        consumer="c",
        topics="forged",
        # no background writes during the count: heartbeats every 60 s, due within a third of
        # the TTL the last one announced (the join's: member_ttl_s)
        BUCKETQ_CONSUMER__HEARTBEAT_INTERVAL_S="60",
        BUCKETQ_CONSUMER__MEMBER_TTL_S="180",
    )
    with sc.client() as client:
        client.publish("forged", {"n": 1})
        (msg,) = eventually(lambda: client.pull(max_messages=1, wait=1), 20, "the message")
    real = msg.receipt or ""
    topic, partition, seq, idx, token = real.split(":")

    def writes() -> tuple[int, int]:
        status = sc.status()
        requests = status.get("s3_requests", {})
        return requests.get("PUT", 0) + requests.get("DELETE", 0), status["counters"]["commits"]

    time.sleep(1.0)  # let the claim's commit settle
    before = writes()
    forged = [f"{topic}:{partition}:{seq}:{idx}:{'0' * 23}{n % 10}" for n in range(25)]
    forged += [f"{topic}:{partition}:{int(seq) + 1 + n}:0:{token}" for n in range(25)]
    for receipt in forged:
        status, answer = post(sc, "/v1/ack", json.dumps({"receipt": receipt}).encode())
        assert (status, answer["error"]) == (409, "lease_lost"), answer
    status, batch = post(
        sc, "/v1/extend/batch", json.dumps({"entries": [{"receipt": forged[0], "seconds": 5.0}]}).encode()
    )
    assert status == 200 and batch["results"][0]["status"] == 409
    time.sleep(1.0)
    assert writes() == before, "forged receipts caused bucket writes or cursor deltas"

    for bad in (
        f"{topic}:-1:{seq}:{idx}:{token}",
        f"{topic}:{partition}:-{seq}:{idx}:{token}",
        f"{topic}:{partition}:{seq}:+{idx}:{token}",
        f"{topic}:{partition}:{'9' * 5000}:{idx}:{token}",
        f"{topic}:{partition}:{seq}:{idx}:{token}\n",
    ):
        status, answer = post(sc, "/v1/ack", json.dumps({"receipt": bad}).encode())
        assert status == 400 and answer["error"] in {"invalid_receipt", "invalid_request"}, answer

    assert post(sc, "/v1/ack", json.dumps({"receipt": real}).encode())[0] == 200
    status, answer = post(sc, "/v1/ack", json.dumps({"receipt": real}).encode())
    assert (status, answer.get("outcome")) == (200, "acked"), "a repeated ack stays idempotent"


# -- 5. slow clients are cut off ------------------------------------------------------------------


def _trickle(port: int, lines: list[bytes], every: float, give_up: float) -> float:
    """Send ``lines`` one by one every ``every`` seconds; seconds until the server closed."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=give_up) as sock:
        sock.settimeout(every)
        for line in lines:
            try:
                sock.sendall(line)
            except OSError:
                return time.monotonic() - started
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - started
                while sock.recv(4096):  # an error answer (408): read to the close
                    pass
                return time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:
                return time.monotonic() - started
            if time.monotonic() - started > give_up:
                break
    raise AssertionError(f"the server kept a trickling connection open for {give_up:g}s")


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
async def test_slow_headers_bodies_and_idle_connections_are_closed(
    tmp_path: Path, sidecars: SidecarFactory
) -> None:
    settings = file_settings(tmp_path)
    await create_topics(settings, "slow")
    sc = file_sidecar(sidecars, settings, "slow", idle_timeout_s=2, body_timeout_s=2)
    head = [b"POST /v1/publish/slow HTTP/1.1\r\n"] + [b"X-Slow-%d: 1\r\n" % i for i in range(100)]
    for port in (sc.port, sc.metrics_port):
        took = _trickle(port, head, every=0.5, give_up=20)
        assert took < 5, f"a trickled request head was allowed {took:.1f}s on port {port}"
    body_head = (
        b"POST /v1/publish/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    took = _trickle(sc.port, [body_head] + [b" "] * 100, every=0.5, give_up=20)
    assert took < 5, f"a trickled body was allowed {took:.1f}s"
    with socket.create_connection(("127.0.0.1", sc.port), timeout=20) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""
        assert time.monotonic() - started < 5, "an idle connection stayed open"


# -- 8. /readyz reveals nothing, 13. every request's deadline covers its S3 calls ------------------


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
async def test_outage_answers_503_within_the_publish_timeout_and_readyz_tells_no_details(
    moto_server: S3Server, sidecars: SidecarFactory
) -> None:
    target = urlsplit(moto_server.endpoint_url)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        settings = moto_server.settings(s3_endpoint_url=proxy.url)  # default retries (6 attempts)
        await create_topics(settings, "late", "cold")
        sc = sidecars(settings, "late", consumer="c", topics="late", publish_timeout_s=2, s3_stall_s=2)
        assert post(sc, "/v1/publish/late", b'{"payload": 1}')[0] == 200
        proxy.down()
        # "cold": a topic this sidecar never read, so the publish must read its configuration from
        # the bucket (the same read as when a cached one expires after CONFIG_TTL_S, without the
        # 10 s wait): the request's deadline has to cover that lookup and its retries
        started = time.monotonic()
        req = urllib.request.Request(
            sc.url + "/v1/publish/cold/batch",
            data=b'{"messages": [{"payload": 1}, {"payload": 2}]}',
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(req, timeout=60)
        took = time.monotonic() - started
        assert failed.value.code == 503 and failed.value.headers["Retry-After"] == "1"
        assert json.loads(failed.value.read())["error"] in {"publish_timeout", "storage_unavailable"}
        assert took < 2 + 1.5, f"a publish during the outage answered after {took:.1f}s (timeout 2s)"

        _, ready = eventually(
            lambda: (r := get(sc.url + "/readyz"))[0] == 503 and r, 30, "/readyz to report the outage"
        )
        text = json.dumps(ready)
        assert settings.s3_bucket and settings.s3_bucket not in text and str(proxy.port) not in text, text
        assert ready == {"ready": False, "state": "ready", "reason": "bucket not answering"}
        detailed = sc.status()
        assert detailed["ready"] is False and "not answering" in detailed["reason"]
        proxy.up()
        eventually(lambda: get(sc.url + "/readyz")[0] == 200, 30, "/readyz to recover")


# -- 12. abandoned long polls ---------------------------------------------------------------------


async def test_abandoned_long_poll_gives_its_message_back_uncounted(
    tmp_path: Path, sidecars: SidecarFactory
) -> None:
    settings = file_settings(tmp_path)
    await create_topics(settings, "poll")
    sc = file_sidecar(sidecars, settings, "poll", consumer="c", topics="poll", visibility_timeout_s=60)
    body = b'{"max_messages": 1, "wait_seconds": 20}'
    with socket.create_connection(("127.0.0.1", sc.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/pull HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.5)  # the long poll is waiting
    # the client hung up; a message arrives for its (still waiting) request
    with sc.client() as client:
        client.publish("poll", {"n": 1})
        started = time.monotonic()
        (msg,) = eventually(lambda: client.pull(max_messages=1, wait=1), 30, "the message to come back")
        assert time.monotonic() - started < 30
        assert msg.deliveries == 1, "the abandoned delivery was counted"
        client.ack(msg.receipt or "")


# -- compressed bodies (issue 23, finding 5) -------------------------------------------------------


def _deflate_bomb(size: int, wbits: int) -> bytes:
    """A JSON object padded with ``size`` bytes of spaces (still valid JSON once inflated), compressed
    (``wbits`` 31: gzip, 15: zlib/deflate): about a thousandth of ``size`` on the wire."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    chunk = b" " * (16 * MiB)
    parts = [compressor.compress(b'{"payload": 1}')]
    parts += [compressor.compress(chunk) for _ in range(size // len(chunk))]
    parts.append(compressor.flush())
    return b"".join(parts)


def _post_encoded(
    sc: SidecarProc, body: bytes, encoding: str, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        sc.url + "/v1/publish/zip",
        data=body,
        method="POST",
        headers={"Content-Type": content_type, "Content-Encoding": encoding},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": None, "message": raw.decode(errors="replace")}


async def test_compressed_bodies_are_refused_before_they_are_inflated(
    tmp_path: Path, sidecars: SidecarFactory
) -> None:
    """A gzip body of 512 MiB of spaces is 0.5 MiB on the wire, within the body limit: inflated it
    cost 112-120 MiB each, six at once 350 MiB (above the chart's 256 Mi limit for the sidecar).
    Non-identity Content-Encoding is refused with 415 before a byte is inflated; nothing is
    published, and peak memory stays where it was."""
    gzip_bomb = _deflate_bomb(512 * MiB, 31)
    deflate_bomb = _deflate_bomb(64 * MiB, 15)
    assert len(gzip_bomb) < MiB
    settings = file_settings(tmp_path)
    await create_topics(settings, "zip")
    sc = file_sidecar(sidecars, settings, "zip")
    pid = sc.process.pid
    status, answer = _post_encoded(sc, b'{"payload": "plain"}', "identity")
    assert status == 200, answer  # identity is no encoding: accepted (and warms every code path)
    exact = _reset_peak(pid)
    baseline = _status_kib(pid, "VmRSS" if exact else "VmHWM")

    outcomes: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def send(body: bytes, encoding: str) -> None:
        result = _post_encoded(sc, body, encoding)
        with lock:
            outcomes.append(result)

    senders = [threading.Thread(target=send, args=(gzip_bomb, "gzip")) for _ in range(6)]
    senders += [threading.Thread(target=send, args=(deflate_bomb, enc)) for enc in ("deflate", "DEFLATE")]
    senders.append(threading.Thread(target=send, args=(gzip_bomb, "identity, gzip")))
    senders.append(threading.Thread(target=send, args=(b"\x1b\x00", "br")))
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join(timeout=90)
    assert len(outcomes) == len(senders), "a request got no answer"
    for status, answer in outcomes:
        assert (status, answer["error"]) == (415, "unsupported_content_encoding"), answer
        assert "Content-Encoding" in answer["message"]
    peak = _status_kib(pid, "VmHWM")
    assert peak - baseline <= 16 * 1024, (
        f"compressed bodies raised peak RSS by {(peak - baseline) // 1024} MiB"
    )
    assert sc.process.poll() is None

    async with Bucketq(settings) as bq:
        info = await bq.describe_topic("zip")
    assert info.messages == 1, "only the plain publish is in the topic"


async def test_compressed_raw_and_cloudevents_bodies_are_refused_too(
    tmp_path: Path, sidecars: SidecarFactory
) -> None:
    """Raw bodies (any Content-Type) and CloudEvents are read by another path than the JSON
    envelope: a compressed one is refused with 415 there too, and nothing is published."""
    settings = file_settings(tmp_path)
    await create_topics(settings, "zip")
    sc = file_sidecar(sidecars, settings, "zip")
    event = json.dumps(
        {"specversion": "1.0", "id": "1", "source": "/t", "type": "t", "data": {"n": 1}}
    ).encode()
    for content_type, body in [
        ("text/plain", b"hello"),
        ("application/octet-stream", b"\x00\x01"),
        ("application/cloudevents+json", event),
    ]:
        status, answer = _post_encoded(sc, zlib.compress(body), "deflate", content_type)
        assert (status, answer["error"]) == (415, "unsupported_content_encoding"), (content_type, answer)
    status, answer = _post_encoded(sc, b"hello", "identity", "text/plain")
    assert status == 200, answer  # the same raw body uncompressed is accepted
    async with Bucketq(settings) as bq:
        info = await bq.describe_topic("zip")
    assert info.messages == 1, "only the uncompressed publish is in the topic"
