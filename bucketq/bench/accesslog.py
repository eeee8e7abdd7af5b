"""Server-side request counts: moto server's access log, read between two offsets, counted by kind.

moto server (werkzeug) writes one line per request to its log (:func:`bucketq.bench.servers.start_moto`
sends stdout and stderr to ``moto.log``)::

    127.0.0.1 - - [27/Nov/2026 01:46:38] "PUT /bq-81736debac/t/.wake HTTP/1.1" 200 -
    127.0.0.1 - - [27/Nov/2026 01:46:38] "\\x1b[33mGET /bq-81736debac/t/p0001/head.json HTTP/1.1\\x1b[0m" 404 -

Non-2xx lines are wrapped in ANSI colour codes, which are stripped before parsing. werkzeug logs a
request when it starts its response, so a request the client has seen answered is in the log.

Every request is named twice: by S3 operation (``GET``, ``HEAD``, ``PUT``, ``LIST``, ``DELETE``, as
:class:`bucketq.storage.RequestStats` names the client's requests, plus ``POST`` and ``OTHER``) and
by call (``"GET segment miss"``, ``"PUT head 412"``), as :class:`bucketq.bench.metered.MeteredStore`
names the engine's calls, with the kind of object taken from the key (or LIST prefix) by
:func:`bucketq.bench.metered.key_kind`, so kinds the layout adds later are counted without change here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote

from bucketq.bench.metered import key_kind

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_REQUEST = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[0-9.]+" (?P<status>\d{3})\b')

# Query parameters of ListObjects(V2); a GET on the bucket with only these (or none) is a LIST.
_LIST_PARAMS = frozenset(
    {
        "list-type",
        "prefix",
        "delimiter",
        "marker",
        "max-keys",
        "encoding-type",
        "start-after",
        "continuation-token",
        "fetch-owner",
    }
)
# Bucket sub-resources that are listings too (priced as LIST by S3).
_LIST_SUBRESOURCES = frozenset({"versions", "uploads"})
_CHUNK = 64 * 1024
MULTI_DELETE = "multi"  # the kind of a multi-object delete: its keys are in the body, not the line


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (werkzeug colours non-2xx lines)."""
    return ANSI.sub("", text)


@dataclass(frozen=True)
class AccessEntry:
    """One request line: HTTP method, decoded path, query parameters, status."""

    method: str
    path: str
    query: dict[str, list[str]]
    status: int


def parse_line(line: str) -> AccessEntry | None:
    """The request of one access-log line, or None for any other line (banner, warning, traceback)."""
    found = _REQUEST.search(strip_ansi(line))
    if found is None:
        return None
    path, _, query = found["target"].partition("?")
    return AccessEntry(
        method=found["method"],
        path=unquote(path),
        query=parse_qs(query, keep_blank_values=True),
        status=int(found["status"]),
    )


@dataclass(frozen=True)
class S3Request:
    """What an access-log entry was in S3 terms (path-style addressing: ``/bucket/key``)."""

    bucket: str
    key: str  # the object key, the LIST prefix, or "" for a bucket-level request
    method: str
    op: str  # GET HEAD PUT LIST DELETE POST OTHER
    call: str  # "OP kind" plus " miss" (404 on GET/HEAD), " 412", or the status when not 2xx


def _status_suffix(op: str, status: int) -> str:
    if 200 <= status < 300:
        return ""
    if status == 404 and op in ("GET", "HEAD"):
        return " miss"
    return f" {status}"


def classify(entry: AccessEntry) -> S3Request:
    """Name the S3 operation and call of a path-style request."""
    bucket, _, key = entry.path.lstrip("/").partition("/")
    method, query = entry.method, entry.query
    kind_key = key
    if method == "GET" and not key and (set(query) <= _LIST_PARAMS or set(query) & _LIST_SUBRESOURCES):
        op = "LIST"
        kind_key = query.get("prefix", [""])[0]
    elif method == "POST" and not key and "delete" in query:
        op = "DELETE"
    elif method in ("GET", "HEAD", "PUT", "DELETE", "POST"):
        op = method  # a COPY is a PUT with a header: the same price, not told apart here
    else:
        op = "OTHER"
    kind = MULTI_DELETE if op == "DELETE" and method == "POST" else key_kind(kind_key)
    call = f"{op} {kind}{_status_suffix(op, entry.status)}"
    return S3Request(bucket=bucket, key=kind_key, method=method, op=op, call=call)


@dataclass
class ServerCounts:
    """Requests one bucket received, by HTTP method, by S3 operation and by call (``"OP kind"``)."""

    by_method: Counter[str] = field(default_factory=Counter)
    by_op: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def add(self, request: S3Request) -> None:
        self.by_method[request.method] += 1
        self.by_op[request.op] += 1
        self.calls[request.call] += 1

    def __add__(self, other: ServerCounts) -> ServerCounts:
        return ServerCounts(
            self.by_method + other.by_method, self.by_op + other.by_op, self.calls + other.calls
        )


def count_lines(lines: Iterable[str], bucket: str) -> ServerCounts:
    """Count the requests to ``bucket`` among ``lines`` (requests to other buckets are ignored)."""
    out = ServerCounts()
    for line in lines:
        entry = parse_line(line)
        if entry is None:
            continue
        request = classify(entry)
        if request.bucket == bucket:
            out.add(request)
    return out


class AccessLog:
    """A growing access-log file, read in whole lines between offsets.

    :meth:`mark` returns the offset just past the last complete line written so far; lines between
    two marks are exactly the requests logged in between (a line being written at a mark belongs to
    the later window).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._boundary = 0  # an offset known to be at a line start

    def mark(self) -> int:
        # Search backwards from the end for the last newline: a long log is not re-read per mark.
        with self.path.open("rb") as f:
            end = f.seek(0, 2)
            while end > self._boundary:
                start = max(self._boundary, end - _CHUNK)
                f.seek(start)
                last = f.read(end - start).rfind(b"\n")
                if last >= 0:
                    self._boundary = start + last + 1
                    break
                end = start
        return self._boundary

    def lines(self, start: int, end: int) -> list[str]:
        """The lines between two marks."""
        if end < start:
            raise ValueError(f"log window ends ({end}) before it starts ({start})")
        with self.path.open("rb") as f:
            f.seek(start)
            data = f.read(end - start)
        return data.decode("utf-8", errors="replace").splitlines()

    def count(self, start: int, end: int, bucket: str) -> ServerCounts:
        return count_lines(self.lines(start, end), bucket)
