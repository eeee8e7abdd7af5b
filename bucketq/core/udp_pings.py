"""The UDP adapter of the wake-ping port (core/pings.py): one datagram socket per connection.

The socket is bound to the advertised address itself (not every interface) unless ``listen_host``
says otherwise, and the advertised address is, unless configured, the local address this host
reaches the bucket's endpoint from: in a pod that is the pod IP, next to a local S3 server it is
the loopback address. No packet is sent to find it (a UDP ``connect`` only chooses a route).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from bucketq.config import Settings

log = logging.getLogger("bucketq.pings")


async def route_address(host: str, port: int) -> str | None:
    """The local IP this host would send from to reach ``host``:``port``; None when unknown."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(sockaddr)
            except OSError:
                continue
            local = str(probe.getsockname()[0])
            if not ipaddress.ip_address(local).is_unspecified:
                return local
    return None


async def advertised_host(settings: Settings) -> str | None:
    """The host pings are received on: ``ping.advertise_host``, else the route to the bucket."""
    if settings.ping.advertise_host:
        return settings.ping.advertise_host
    if settings.backend != "s3":
        return "127.0.0.1"  # a file or memory bucket is shared by processes of this host
    if settings.s3_endpoint_url:
        url = urlsplit(settings.s3_endpoint_url)
        host = url.hostname or ""
        port = url.port or (443 if url.scheme == "https" else 80)
    else:
        host, port = f"s3.{settings.s3_region}.amazonaws.com", 443
    return await route_address(host, port)


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, receive: Callable[[bytes], None]) -> None:
        self.receive = receive

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            self.receive(data)
        except Exception:  # a receiver's bug must not close the socket
            log.exception("wake ping handler failed")

    def error_received(self, exc: Exception) -> None:
        log.debug("wake ping socket: %s", exc)  # e.g. ICMP port unreachable from a gone member


class UdpPings:
    """Wake pings over UDP: receives on ``host``:``port`` (port 0: one the system chooses) and
    advertises ``udp://<advertise>:<port>``."""

    def __init__(self, advertise: str, *, listen_host: str | None = None, port: int = 0) -> None:
        self.advertise = advertise
        self.listen_host = listen_host or advertise
        self.port = port
        self._transport: asyncio.DatagramTransport | None = None

    async def open(self, receive: Callable[[bytes], None]) -> str | None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Receiver(receive), local_addr=(self.listen_host, self.port)
        )
        self._transport = transport
        port = transport.get_extra_info("sockname")[1]
        host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
        return f"udp://{host}:{port}"

    def send(self, address: str, payload: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        url = urlsplit(address)
        if url.hostname is None or url.port is None:
            return
        try:
            self._transport.sendto(payload, (url.hostname, url.port))
        except (OSError, ValueError) as exc:  # another address family, an unroutable address
            log.debug("wake ping to %s not sent: %s", address, exc)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


async def udp_pings(settings: Settings) -> UdpPings | None:
    """The UDP network the settings ask for; None when pings are off or no address was found."""
    if not settings.ping.enabled:
        return None
    host = await advertised_host(settings)
    if host is None:
        log.warning(
            "no local address reaches the bucket's endpoint: wake pings are off (set "
            "BUCKETQ_PING__ADVERTISE_HOST); idle pickup waits for the wake poll"
        )
        return None
    return UdpPings(host, listen_host=settings.ping.listen_host, port=settings.ping.listen_port)
