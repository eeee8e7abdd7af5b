"""``bucketq dev`` (a local bucket and its environment) and ``bucketq run`` (an app with its
sidecar), as real processes: the examples run under it in pull and push mode, the two stop
together whichever ends first, even when ``bucketq run`` itself is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import alive
from tests.support.servers import free_ports

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUCKETQ_", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env | extra


def bq(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bucketq.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def ok(*args: str, env: dict[str, str]) -> str:
    result = bq(*args, env=env)
    assert result.returncode == 0, (
        f"bucketq {' '.join(args)} -> {result.returncode}: {result.stdout}{result.stderr}"
    )
    return result.stdout


def exported(lines: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)$", lines, re.MULTILINE))


def sidecar_pid(stderr: str) -> int:
    return int(re.search(r"bucketq run: sidecar at \S+ \(.*\), pid (\d+)", stderr)[1])  # type: ignore[index]


@pytest.fixture
def file_env(tmp_path: Path) -> dict[str, str]:
    """The environment ``bucketq dev --backend file`` prints (no server)."""
    env = base_env(BUCKETQ_DEV_DIR=str(tmp_path / "dev"))
    return env | exported(ok("dev", "--backend", "file", env=env))


@pytest.mark.s3
def test_dev_starts_reuses_and_stops_a_moto_server(tmp_path: Path) -> None:
    env = base_env(BUCKETQ_DEV_DIR=str(tmp_path / "dev"))
    first = bq("dev", env=env)
    assert first.returncode == 0, first.stderr
    variables = exported(first.stdout)
    assert variables["BUCKETQ_BACKEND"] == "s3" and variables["BUCKETQ_S3_BUCKET"] == "bucketq-dev"
    pid = int(re.search(r"pid (\d+)", first.stderr)[1])  # type: ignore[index]
    try:
        assert exported(ok("dev", env=env)) == variables  # the running server is reused
        with_env = env | variables
        ok("topic", "create", "orders", env=with_env)
        assert json.loads(ok("topic", "list", "--json", env=with_env)) == ["orders"]
        # it lives in its own session: it outlived the command that started it
        assert alive(pid) and os.getsid(pid) == pid
    finally:
        stopped = bq("dev", "--stop", env=env)
    assert stopped.returncode == 0 and "unset BUCKETQ_S3_ENDPOINT_URL" in stopped.stdout
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert "no dev server running" in bq("dev", "--stop", env=env).stderr


def test_dev_without_moto_names_the_extra(tmp_path: Path) -> None:
    # an interpreter that finds no moto server (as in an install without the extra)
    no_moto = "import bucketq.bench.servers as s; s.moto_command = lambda: None; from bucketq.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", no_moto, "dev"],
        env=base_env(BUCKETQ_DEV_DIR=str(tmp_path / "dev")), capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: bucketq dev needs the local extra: pip install 'bucketq[local]' (or use --backend file)"
    )


def test_first_run_without_a_bucket_names_bucketq_dev() -> None:
    result = bq("topic", "create", "orders", env=base_env())
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: no bucket configured: give --bucket (and --endpoint-url) or BUCKETQ_S3_BUCKET, or start a "
        'local one with: eval "$(bucketq dev)" (or use a directory: --backend file --file-path DIR)'
    )
    assert "Value error" not in bq("--backend", "file", "topic", "list", env=base_env()).stderr


def test_run_pull_worker_example_on_the_file_store(file_env: dict[str, str]) -> None:
    """The documented loop on the file backend: the CLI, the sidecar and the app share a directory."""
    ok("topic", "create", "orders", "-p", "2", env=file_env)
    ok("publish", "orders", '{"id": 1, "amount": 5}', '{"id": 2}', '{"id": 3}', env=file_env)
    result = bq(
        "run",
        "orders",
        "--",
        "python",
        "examples/worker.py",
        "--max-messages",
        "3",
        "--wait",
        "1",
        env=file_env,
    )
    assert result.returncode == 0, result.stderr
    assert "worker done: 3 processed, 0 failed" in result.stdout
    assert "(consumer worker of orders)" in result.stderr  # the consumer is named after the app
    assert "sidecar | " in result.stderr and "stopped (exit code 0)" in result.stderr
    assert not alive(sidecar_pid(result.stderr))
    (row,) = json.loads(ok("stats", "orders", "-c", "worker", "--json", env=file_env))
    assert (row["acked"], row["backlog"], row["in_flight"]) == (3, 0, 0)


def test_run_without_topics_is_publish_only_and_the_worker_says_what_to_do(file_env: dict[str, str]) -> None:
    result = bq("run", "--", "python", "examples/worker.py", env=file_env)
    assert result.returncode == 2
    assert "(publish only)" in result.stderr
    assert (
        "the sidecar consumes no topic: name it, e.g. bucketq run orders -- python examples/worker.py"
        in result.stderr
    )


def test_run_push_mode_delivers_to_the_app_port(file_env: dict[str, str]) -> None:
    ok("topic", "create", "orders", env=file_env)
    ok("publish", "orders", '{"id": 1}', '{"id": 2, "flaky": true}', '{"no": "id"}', env=file_env)
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", "run", "orders", "-c", "pushed", "--app-port", str(port), "--",
         "python", "examples/push_worker.py"],
        env=file_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # two acked (one after a RETRY), the one without an id dropped to the dead letters
            stats = json.loads(ok("stats", "orders", "-c", "pushed", "--json", env=file_env) or "[]")
            if stats and stats[0]["acked"] == 2 and stats[0]["dead_lettered"] == 1:
                break
            assert time.monotonic() < deadline and proc.poll() is None, "push delivery did not finish"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)  # passed on to the app; then the sidecar drains
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"--app-port {port}" not in err and "(consumer pushed of orders)" in err
    assert f"push handler listening on http://127.0.0.1:{port}/bucketq" in err  # BUCKETQ_APP_PORT reached it
    assert not alive(sidecar_pid(err))


def test_the_apps_exit_code_and_environment(file_env: dict[str, str]) -> None:
    app = (
        "import os, sys, urllib.request; url = os.environ['BUCKETQ_SIDECAR_URL'];"
        "print(urllib.request.urlopen(url + '/readyz').status); sys.exit(7)"
    )
    result = bq("run", "--", "python", "-c", app, env=file_env)
    assert result.returncode == 7 and result.stdout.strip() == "200"  # the sidecar was ready first


def test_a_sidecar_that_cannot_get_ready_never_starts_the_app(
    file_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    result = bq("run", "missing", "--ready-timeout", "3s", "--", "touch", str(marker), env=file_env)
    assert result.returncode == 1
    assert "error: the sidecar was not ready within 3s:" in result.stderr
    assert not marker.exists()
    assert not alive(sidecar_pid(result.stderr))


def run_sleeping_app(env: dict[str, str]) -> tuple[subprocess.Popen[str], int, int]:
    """``bucketq run`` of an app that sleeps; returns it, the app's pid and the sidecar's."""
    app = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", "run", "--", "python", "-c", app],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    app_pid = int(proc.stdout.readline())
    return proc, app_pid, sidecar_pid(proc.stderr.readline())


def test_when_the_sidecar_dies_the_app_is_stopped(file_env: dict[str, str]) -> None:
    proc, app_pid, sidecar = run_sleeping_app(file_env)
    os.kill(sidecar, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "the sidecar exited with code -9: stopping the app" in err
    assert not alive(app_pid)


def test_killing_bucketq_run_stops_both(file_env: dict[str, str]) -> None:
    proc, app_pid, sidecar = run_sleeping_app(file_env)
    proc.kill()  # SIGKILL: no cleanup of its own
    proc.wait(10)
    deadline = time.monotonic() + 30
    while (alive(app_pid) or alive(sidecar)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(app_pid) and not alive(sidecar)


def test_run_takes_its_topics_from_the_environment_as_the_sidecar_does(file_env: dict[str, str]) -> None:
    ok("topic", "create", "orders", env=file_env)
    ok("publish", "orders", '{"id": 1}', env=file_env)
    env = file_env | {"BUCKETQ_SIDECAR_TOPICS": "orders"}
    result = bq("run", "--", "python", "examples/worker.py", "--max-messages", "1", "--wait", "1", env=env)
    assert result.returncode == 0, result.stderr
    assert "(consumer worker of orders)" in result.stderr and "worker done: 1 processed" in result.stdout


def test_stats_separates_what_the_app_holds_from_what_the_sidecar_prefetched(
    file_env: dict[str, str],
) -> None:
    """The bucket knows leases only; the sidecar knows which of them it handed to its app."""
    ok("topic", "create", "orders", env=file_env)
    ok("publish", "orders", *(str(n) for n in range(20)), env=file_env)
    app = (
        "import os, subprocess, sys, time; from bucketq.client import Client\n"
        "url = os.environ['BUCKETQ_SIDECAR_URL']\n"
        "with Client(url) as c: held = c.pull(max_messages=3, wait=5)\n"
        "assert len(held) == 3\n"
        "sys.exit(subprocess.run([sys.executable, '-m', 'bucketq.cli', 'stats', 'orders', '--sidecar', url]).returncode)"
    )
    result = bq("run", "orders", "-c", "billing", "--", "python", "-c", app, env=file_env)
    assert result.returncode == 0, result.stderr
    line = re.search(
        r"^sidecar http://\S+ \(billing\): (\d+) leased = (\d+) delivered .* \+ (\d+) prefetched$",
        result.stdout,
        re.M,
    )
    assert line, result.stdout
    leased, delivered, prefetched = map(int, line.groups())
    assert delivered == 3 and leased == delivered + prefetched
    table = re.search(r"^orders\s+billing\s+20\s+(\d+)\s+(\d+)\s", result.stdout, re.M)
    assert table and int(table[2]) >= delivered, result.stdout  # the bucket's leased column: both kinds


def test_ctrl_c_reaches_the_app_once_then_the_sidecar_stops(file_env: dict[str, str]) -> None:
    """Ctrl-C at a terminal signals the foreground process group: the app (which shares it) gets
    it once, bucketq run waits for the app and then stops the sidecar (in its own session)."""
    import pty

    master, slave = pty.openpty()
    app = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: (print('interrupted', flush=True), sys.exit(42)))\n"
        "print(os.getpid(), flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", "run", "--", "python", "-c", app],
        stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=file_env, cwd=ROOT, text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )  # fmt: skip
    os.close(slave)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        app_pid = int(proc.stdout.readline())
        sidecar = sidecar_pid(proc.stderr.readline())
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    assert proc.returncode == 42, err
    assert out.count("interrupted") == 1  # once: bucketq run did not pass on a second SIGINT
    assert not alive(app_pid) and not alive(sidecar)
    assert "stopped (exit code 0)" in err


def test_a_signal_while_the_app_starts_reaches_the_app_and_bucketq_run_waits_for_it() -> None:
    """A Ctrl-C or SIGTERM that comes while bucketq run is starting the app (between fork and its
    handlers) is the app's once it exists: bucketq run does not die of it (leaving the app without
    its sidecar), passes it on, and returns the app's exit status (here: ended by SIGINT, 130)."""
    # the signal arrives inside Popen, before the app exists: the worst moment, made certain
    script = (
        "import os, signal, subprocess, sys\n"
        "from bucketq.cli import runner\n"
        "real = subprocess.Popen\n"
        "class Interrupted(real):\n"
        "    def __init__(self, *a, **k):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        super().__init__(*a, **k)\n"
        "        print('app', self.pid, flush=True)\n"
        "sidecar = real([sys.executable, '-c', 'import time; time.sleep(60)'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "runner.subprocess.Popen = Interrupted\n"
        "app = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "code = runner._run_app(app, 'http://127.0.0.1:9', None, sidecar)\n"
        "sidecar.kill()\n"
        "print('exit', code, flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=ROOT
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    started, ended = result.stdout.splitlines()
    assert ended == "exit 130", result.stdout  # the app's status: it was ended by the SIGINT
    assert not alive(int(started.split()[1]))


@pytest.mark.parametrize(
    ("argv", "name"),
    [(["python", "examples/worker.py"], "worker"), (["python", "-m", "shop.billing_worker"], "billing-worker"),
     (["bash"], "bash"), (["python", "-c", "pass"], "python"), (["./Run Me"], "run-me")],
)  # fmt: skip
def test_the_default_consumer_is_named_after_the_app(argv: list[str], name: str) -> None:
    from bucketq.cli.runner import default_consumer

    assert default_consumer(argv) == name
