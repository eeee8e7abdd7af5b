"""``bucketq demo`` on the filesystem backend."""

from __future__ import annotations

from typer.testing import CliRunner

from bucketq.cli import app


def test_demo_on_file_backend_exits_0_with_summary() -> None:
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--backend",
            "file",
            "--messages",
            "200",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--partitions",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    for label in ("messages", "msgs/s", "S3 requests per message", "duplicates", "lost"):
        assert label in result.stdout
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.stdout.splitlines()
        if line.count("│") == 3
    }
    assert rows["messages"] == rows["acked"] == "200"
    assert rows["duplicates"] == rows["lost"] == "0"
