"""The moto server the tests, benchmarks and ``bucketq dev`` start (bucketq/bench/moto_server.py):
moto's own server, with the list of its backends read once instead of on every request."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bucketq.bench.servers import moto_command, start_moto


def test_it_is_what_every_moto_server_here_runs() -> None:
    assert moto_command() == [sys.executable, "-m", "bucketq.bench.moto_server"]


def test_the_backends_read_once_are_the_ones_moto_lists_per_request() -> None:
    # in a fresh interpreter: the entry point replaces moto's function, then is asked again
    code = (
        "import moto.backends as b, moto.server as s\n"
        "scan = b.list_of_moto_modules\n"
        "fresh = list(scan())\n"
        "s.main = lambda argv: print(b.list_of_moto_modules is not scan, list(b.list_of_moto_modules()) == fresh,"
        " 's3' in fresh)\n"
        "from bucketq.bench.moto_server import main\n"
        "main([])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["True", "True", "True"]


@pytest.mark.s3
def test_it_serves_s3_and_logs_every_request(tmp_path: Path) -> None:
    server = start_moto(tmp_path)
    try:
        s3 = server.client()
        s3.create_bucket(Bucket="served-bucket")
        s3.put_object(Bucket="served-bucket", Key="a", Body=b"1", IfNoneMatch="*")
        assert s3.get_object(Bucket="served-bucket", Key="a")["Body"].read() == b"1"
        with urllib.request.urlopen(server.endpoint_url + "/moto-api/data.json", timeout=10) as reply:
            assert reply.status == 200  # moto's own API answers too: the host lookup is unchanged
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert log.count('"PUT /served-bucket') == 2 and log.count('"GET /served-bucket/a') == 1
