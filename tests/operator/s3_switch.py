"""A TCP forwarder in front of the S3 server that can be switched off to emulate an outage."""

from __future__ import annotations

import contextlib
import socket
import threading


class S3Switch:
    """Forwards 127.0.0.1:``port`` to the upstream; while down, connections are cut at once."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._up = threading.Event()
        self._up.set()
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="s3-switch", daemon=True).start()

    def down(self) -> None:
        self._up.clear()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._conns.clear()

    def up(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._closed = True
        self.down()
        with contextlib.suppress(OSError):
            self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with self._lock:
                    self._conns.discard(sock)
