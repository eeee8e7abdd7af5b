"""``bucketq dev``: a local bucket to start from, and the environment that points at it.

Like ``ssh-agent``, it starts what is needed in the background and prints shell lines to
``eval``::

    eval "$(bucketq dev)"            # a moto S3 server (the demo's) on 127.0.0.1, in the background
    eval "$(bucketq dev --backend file)"   # a directory instead: no server at all
    eval "$(bucketq dev --stop)"     # stop the server, unset the variables

Invariants: at most one dev server per state directory (a second ``bucketq dev`` reuses the running
one and prints the same environment); the server runs in its own session, so that closing the
terminal or Ctrl-C in it does not stop it, and only ``--stop`` (or its own death) does; ``--stop``
signals only the process this directory's state names, and only if it is still a moto server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import typer

from bucketq.cli.errors import EXIT_ERROR, CliError, fail, stderr

DEV_BUCKET = "bucketq-dev"
DEV_KEY = "bucketq-dev"  # moto accepts any credentials; these name where they come from
STATE_FILE = "state.json"
START_TIMEOUT_S = 60.0
# Every variable ``bucketq dev`` may set (``--stop`` unsets them all, whichever backend it was).
DEV_VARIABLES = (
    "BUCKETQ_BACKEND",
    "BUCKETQ_S3_ENDPOINT_URL",
    "BUCKETQ_S3_BUCKET",
    "BUCKETQ_S3_ACCESS_KEY_ID",
    "BUCKETQ_S3_SECRET_ACCESS_KEY",
    "BUCKETQ_FILE_PATH",
)


class DevBackend(StrEnum):
    moto = "moto"
    file = "file"


@dataclass
class DevState:
    """What ``bucketq dev`` started, kept in the state directory."""

    backend: str
    endpoint_url: str = ""
    pid: int = 0
    file_path: str = ""

    def environment(self) -> dict[str, str]:
        if self.backend == DevBackend.file:
            return {"BUCKETQ_BACKEND": "file", "BUCKETQ_FILE_PATH": self.file_path}
        return {
            "BUCKETQ_BACKEND": "s3",
            "BUCKETQ_S3_ENDPOINT_URL": self.endpoint_url,
            "BUCKETQ_S3_BUCKET": DEV_BUCKET,
            "BUCKETQ_S3_ACCESS_KEY_ID": DEV_KEY,
            "BUCKETQ_S3_SECRET_ACCESS_KEY": DEV_KEY,
        }


def default_dir() -> Path:
    """``$BUCKETQ_DEV_DIR``, else ``$XDG_STATE_HOME/bucketq/dev`` (``~/.local/state/bucketq/dev``)."""
    explicit = os.environ.get("BUCKETQ_DEV_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "bucketq" / "dev"


def command(
    backend: DevBackend = typer.Option(
        DevBackend.moto,
        "--backend",
        "-b",
        help="moto: an S3 server in the background (the demo's); file: a directory, no server.",
    ),
    directory: Path | None = typer.Option(
        None,
        "--dir",
        help="Where the state, the log and the file store live. \\[default: $BUCKETQ_DEV_DIR or "
        "~/.local/state/bucketq/dev]",
        show_default=False,
    ),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="The S3 server's port (0: a free one)."),
    stop: bool = typer.Option(
        False, "--stop", help="Stop the server and print the lines that unset the variables."
    ),
) -> None:
    """Start a local bucket and print its environment: eval "$(bucketq dev)".

    The S3 server keeps running in the background (a second run reuses it) until bucketq dev
    --stop. Every bucketq command, the sidecar, bucketq run and the library read these
    variables; --backend file works for all of them too (a directory several processes share).
    """
    where = directory or default_dir()
    try:
        if stop:
            _stop(where)
            return
        state = _file_store(where) if backend is DevBackend.file else _moto(where, port)
    except CliError as exc:
        fail(exc)
    _print_environment(state, where)


def _print_environment(state: DevState, where: Path) -> None:
    for name, value in state.environment().items():
        typer.echo(f"export {name}={shlex.quote(value)}")
    for name in DEV_VARIABLES:  # a file store after a server (or back) leaves nothing stale
        if name not in state.environment():
            typer.echo(f"unset {name}")
    if state.backend == DevBackend.file:
        stderr().print(f"[green]✓[/] file store in {state.file_path}", highlight=False)
    else:
        stderr().print(
            f"[green]✓[/] moto S3 server at {state.endpoint_url} (pid {state.pid}, bucket {DEV_BUCKET}, "
            f'log {_shown(where / "moto.log")}); stop it with: eval "$(bucketq dev --stop)"',
            highlight=False,
        )
    if sys.stdout.isatty():
        stderr().print('[dim]to use it in this shell: eval "$(bucketq dev)"[/]', highlight=False)


def _shown(path: Path) -> str:
    """``path`` with the home directory as ``~``, as a person would type it."""
    home = Path.home()
    try:
        return "~/" + str(path.resolve().relative_to(home.resolve()))
    except ValueError:
        return str(path)


def _file_store(where: Path) -> DevState:
    path = where / "store"
    path.mkdir(parents=True, exist_ok=True)
    return DevState("file", file_path=str(path.resolve()))


def _read_state(where: Path) -> DevState | None:
    try:
        return DevState(**json.loads((where / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _is_moto(pid: int) -> bool:
    """Whether ``pid`` is alive and a moto server (a recycled pid is someone else's process)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"moto" in cmdline


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer: the server is up
    except OSError:
        return False


def _moto(where: Path, port: int) -> DevState:
    running = _read_state(where)
    if (
        running
        and running.backend == DevBackend.moto
        and _is_moto(running.pid)
        and _answers(running.endpoint_url)
    ):
        return running
    from bucketq.bench.servers import free_ports, moto_command

    command = moto_command()
    if command is None:
        from bucketq._extras import install_hint

        raise CliError(f"{install_hint('bucketq dev', 'local')} (or use --backend file)", EXIT_ERROR)
    where.mkdir(parents=True, exist_ok=True)
    port = port or free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    log_path = where / "moto.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [*command, "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=where,
            start_new_session=True,  # outlives this command and the terminal: --stop ends it
            env={k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BUCKETQ_"))},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                process.kill()
            tail = log_path.read_text(errors="replace")[-1500:]
            raise CliError(f"the moto server did not start on port {port}:\n{tail}", EXIT_ERROR)
        time.sleep(0.05)
    state = DevState("moto", endpoint_url=url, pid=process.pid)
    _create_bucket(state)
    (where / STATE_FILE).write_text(json.dumps(asdict(state)))
    return state


def _create_bucket(state: DevState) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=state.endpoint_url,
        aws_access_key_id=DEV_KEY,
        aws_secret_access_key=DEV_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=DEV_BUCKET)


def _stop(where: Path) -> None:
    state = _read_state(where)
    if state is not None and state.backend == DevBackend.moto and _is_moto(state.pid):
        os.kill(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _is_moto(state.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(state.pid, os.WNOHANG)
            time.sleep(0.05)
        if _is_moto(state.pid):
            os.kill(state.pid, signal.SIGKILL)
        stderr().print(f"stopped the moto server (pid {state.pid})", highlight=False)
    else:
        stderr().print("no dev server running", highlight=False)
    with contextlib.suppress(OSError):
        (where / STATE_FILE).unlink()
    for name in DEV_VARIABLES:
        typer.echo(f"unset {name}")
