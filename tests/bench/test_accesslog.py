"""Server-side request counting from moto server's access log (bucketq/bench/accesslog.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bucketq.bench.accesslog import AccessLog, classify, count_lines, parse_line, strip_ansi
from tests.support.servers import S3Server

BUCKET = "bq-81736debacdd41038329"

# Lines as moto server 5.2.5 (werkzeug 3.1) wrote them in a real run: non-2xx lines are coloured.
BANNER = (
    "\x1b[31m\x1b[1mWARNING: This is a development server. Do not use it in a production deployment. "
    "Use a production WSGI server instead.\x1b[0m\n"
)
RUNNING = " * Running on http://127.0.0.1:45467\n"
QUIT = "\x1b[33mPress CTRL+C to quit\x1b[0m\n"
ROOT = '127.0.0.1 - - [27/Nov/2026 01:46:37] "GET / HTTP/1.1" 200 -\n'
HEAD_BUCKET = f'127.0.0.1 - - [27/Nov/2026 01:46:37] "HEAD /{BUCKET} HTTP/1.1" 200 -\n'
PROBE_412 = (
    f'127.0.0.1 - - [27/Nov/2026 01:46:37] "\x1b[31m\x1b[1mPUT /{BUCKET}/_probe/'
    '430b010fb6e4464fa5f43333e7048596.probe HTTP/1.1\x1b[0m" 412 -\n'
)
PUT_SEGMENT = f'127.0.0.1 - - [27/Nov/2026 01:46:38] "PUT /{BUCKET}/t/p0001/seg/0000000000000000.jsonl HTTP/1.1" 200 -\n'
GET_SEGMENT = f'127.0.0.1 - - [27/Nov/2026 01:46:38] "GET /{BUCKET}/t/p0001/seg/0000000000000000.jsonl HTTP/1.1" 200 -\n'
GET_HEAD_MISS = (
    f'127.0.0.1 - - [27/Nov/2026 01:46:38] "\x1b[33mGET /{BUCKET}/t/p0001/head.json HTTP/1.1\x1b[0m" 404 -\n'
)
PUT_WAKE = f'127.0.0.1 - - [27/Nov/2026 01:46:38] "PUT /{BUCKET}/t/.wake HTTP/1.1" 200 -\n'
LIST_MEMBERS = (
    f'127.0.0.1 - - [27/Nov/2026 01:46:38] "GET /{BUCKET}?list-type=2&prefix=_registry/members/t/g/'
    '&max-keys=1000&encoding-type=url HTTP/1.1" 200 -\n'
)
MULTI_DELETE = f'127.0.0.1 - - [27/Nov/2026 01:46:38] "POST /{BUCKET}?delete HTTP/1.1" 200 -\n'
DELETE_ONE = (
    f'127.0.0.1 - - [27/Nov/2026 01:46:38] "\x1b[35m\x1b[1mDELETE /{BUCKET}/x2 HTTP/1.1\x1b[0m" 204 -\n'
)
OTHER_BUCKET = '127.0.0.1 - - [27/Nov/2026 01:46:38] "PUT /bq-other/t/.wake HTTP/1.1" 200 -\n'

REAL_LOG = [
    BANNER,
    RUNNING,
    QUIT,
    ROOT,
    HEAD_BUCKET,
    PROBE_412,
    PUT_SEGMENT,
    GET_SEGMENT,
    GET_HEAD_MISS,
    PUT_WAKE,
    LIST_MEMBERS,
    MULTI_DELETE,
    DELETE_ONE,
    OTHER_BUCKET,
]


def test_strip_ansi_removes_colour_codes() -> None:
    assert strip_ansi(GET_HEAD_MISS) == (
        f'127.0.0.1 - - [27/Nov/2026 01:46:38] "GET /{BUCKET}/t/p0001/head.json HTTP/1.1" 404 -\n'
    )
    assert "\x1b" not in strip_ansi(PROBE_412) and "\x1b" not in strip_ansi(DELETE_ONE)


@pytest.mark.parametrize("line", [BANNER, RUNNING, QUIT, "", "Traceback (most recent call last):\n"])
def test_lines_that_are_not_requests_are_skipped(line: str) -> None:
    assert parse_line(line) is None


def test_a_coloured_404_line_parses() -> None:
    entry = parse_line(GET_HEAD_MISS)
    assert entry is not None
    assert (entry.method, entry.path, entry.query, entry.status) == (
        "GET",
        f"/{BUCKET}/t/p0001/head.json",
        {},
        404,
    )


@pytest.mark.parametrize(
    ("line", "op", "call"),
    [
        (HEAD_BUCKET, "HEAD", "HEAD other"),
        (PROBE_412, "PUT", "PUT probe 412"),
        (PUT_SEGMENT, "PUT", "PUT segment"),
        (GET_SEGMENT, "GET", "GET segment"),
        (GET_HEAD_MISS, "GET", "GET head miss"),
        (PUT_WAKE, "PUT", "PUT wake"),
        (LIST_MEMBERS, "LIST", "LIST member"),
        (MULTI_DELETE, "DELETE", "DELETE multi"),
        (DELETE_ONE, "DELETE", "DELETE other"),
    ],
)
def test_requests_are_named_by_operation_and_kind(line: str, op: str, call: str) -> None:
    entry = parse_line(line)
    assert entry is not None
    request = classify(entry)
    assert (request.bucket, request.op, request.call) == (BUCKET, op, call)


def test_a_bucket_get_with_a_sub_resource_is_not_a_list() -> None:
    entry = parse_line(f'127.0.0.1 - - [x] "GET /{BUCKET}?location HTTP/1.1" 200 -')
    assert entry is not None and classify(entry).op == "GET"
    entry = parse_line(f'127.0.0.1 - - [x] "GET /{BUCKET}?versions&prefix=t/ HTTP/1.1" 200 -')
    assert entry is not None and classify(entry).op == "LIST"


def test_a_percent_encoded_key_is_decoded_before_its_kind_is_taken() -> None:
    entry = parse_line(
        f'127.0.0.1 - - [x] "GET /{BUCKET}/t/p0000/seg/0000000000000001%2Ejsonl HTTP/1.1" 200 -'
    )
    assert entry is not None and classify(entry).call == "GET segment"


def test_count_lines_counts_one_bucket_by_method_operation_and_call() -> None:
    counts = count_lines(REAL_LOG, BUCKET)
    assert counts.total == 9  # the banner, the root GET and the other bucket's PUT are not counted
    assert counts.by_method == {"HEAD": 1, "PUT": 3, "GET": 3, "POST": 1, "DELETE": 1}
    assert counts.by_op == {"HEAD": 1, "PUT": 3, "GET": 2, "LIST": 1, "DELETE": 2}
    assert counts.calls["PUT probe 412"] == 1 and counts.calls["GET head miss"] == 1
    assert sum(counts.calls.values()) == counts.total == sum(counts.by_method.values())


def test_marks_cover_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "moto.log"
    path.write_text(BANNER + PUT_WAKE)
    log = AccessLog(path)
    start = log.mark()
    assert start == len((BANNER + PUT_WAKE).encode())
    with path.open("a") as f:
        f.write(GET_SEGMENT + PUT_SEGMENT[:30])  # a line half written at the mark
    middle = log.mark()
    assert log.count(start, middle, BUCKET).calls == {"GET segment": 1}
    with path.open("a") as f:
        f.write(PUT_SEGMENT[30:])
    end = log.mark()
    assert log.count(middle, end, BUCKET).calls == {"PUT segment": 1}
    assert log.count(start, end, BUCKET).total == 2
    with pytest.raises(ValueError, match="ends"):
        log.lines(end, start)


def test_marks_find_the_last_line_of_a_long_log(tmp_path: Path) -> None:
    path = tmp_path / "moto.log"
    path.write_text(PUT_WAKE * 5000)  # longer than one backwards read
    log = AccessLog(path)
    first = log.mark()
    assert first == path.stat().st_size
    with path.open("a") as f:
        f.write(LIST_MEMBERS)
    assert log.count(first, log.mark(), BUCKET).calls == {"LIST member": 1}


def test_a_real_moto_server_logs_what_was_sent(moto_server: S3Server) -> None:
    """The log file servers.py gives moto is where the requests show up, coloured lines included."""
    bucket = moto_server.new_bucket()
    client = moto_server.client()
    log = AccessLog(moto_server.log_path)
    start = log.mark()
    client.put_object(Bucket=bucket, Key="t/p0000/seg/0000000000000000.jsonl", Body=b"{}")
    client.get_object(Bucket=bucket, Key="t/p0000/seg/0000000000000000.jsonl")
    with pytest.raises(client.exceptions.NoSuchKey):
        client.get_object(Bucket=bucket, Key="t/p0000/head.json")
    client.head_object(Bucket=bucket, Key="t/p0000/seg/0000000000000000.jsonl")
    client.list_objects_v2(Bucket=bucket, Prefix="t/subs/g/p0000/log/")
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "t/p0000/seg/0000000000000000.jsonl"}]})
    raw = moto_server.log_path.read_bytes()[start:]
    assert b"\x1b[" in raw  # the 404 line is coloured: stripping is needed on this server
    counts = log.count(start, log.mark(), bucket)
    assert counts.calls == {
        "PUT segment": 1,
        "GET segment": 1,
        "GET head miss": 1,
        "HEAD segment": 1,
        "LIST delta": 1,
        "DELETE multi": 1,
    }
    assert counts.by_method == {"PUT": 1, "GET": 3, "HEAD": 1, "POST": 1}
