"""``bucketq run [TOPIC]... [-c CONSUMER] [--app-port N] -- COMMAND...``: an app and its sidecar.

The local twin of a pod with an injected sidecar (and of ``dapr run``): a sidecar process on a free
127.0.0.1 port, then the app with ``BUCKETQ_SIDECAR_URL`` set to it, both stopped together.

Invariants:

* the app starts only once the sidecar is ready (bucket reached, consumer joined), so its first
  request is served; a sidecar that cannot get ready in ``--ready-timeout`` is stopped and its
  reason reported, and the app never starts;
* the app is stopped before the sidecar, so that its last acks and publishes still have a sidecar
  to go through; then the sidecar drains (gives back what it holds, flushes publishes);
* neither outlives ``bucketq run``: when the app exits the sidecar is stopped; when the sidecar
  dies the app is stopped; when ``bucketq run`` is killed (even with SIGKILL) Linux SIGTERMs both;
* the exit code is the app's (a sidecar that died under it: 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import typer
import yaml
from typer.core import TyperCommand

from bucketq.bench.servers import die_with_parent
from bucketq.cli.connection import connection
from bucketq.cli.errors import EXIT_ERROR, CliError, fail, stderr
from bucketq.cli.formats import DURATION_HELP, parse_duration

COMMAND_KEY = "bucketq.run.command"
APP_STOP_GRACE_S = 10.0  # after SIGTERM, the app's time to exit before SIGKILL
SIDECAR_STOP_S = 35.0  # above the sidecar's own shutdown budget (25 s by default)
POLL_S = 0.05


class SplitAtDashes(TyperCommand):
    """A command whose arguments after ``--`` are another program's command line, taken verbatim."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's vendored click Context
        if "--" in args:
            cut = args.index("--")
            ctx.meta[COMMAND_KEY] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)


def command(
    ctx: typer.Context,
    topics: list[str] | None = typer.Argument(
        None,
        help="Topics the app consumes. \\[default: $BUCKETQ_SIDECAR_TOPICS, else none: a publish-only sidecar]",
        show_default=False,
    ),
    consumer: str | None = typer.Option(
        None,
        "--consumer",
        "-c",
        help="Consumer (group) name. \\[default: $BUCKETQ_SIDECAR_CONSUMER, else the app's program name]",
        show_default=False,
    ),
    app_port: int | None = typer.Option(
        None,
        "--app-port",
        min=1,
        max=65535,
        help="Push mode: the sidecar POSTs each message to the app on this port (BUCKETQ_APP_PORT).",
        show_default=False,
    ),
    app_path: str = typer.Option("/bucketq", "--app-path", help="Push mode: the app's path."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="The sidecar's API port (0: a free one)."),
    ready_timeout: str = typer.Option(
        "60s", "--ready-timeout", help=f"Give up when the sidecar is not ready by then ({DURATION_HELP})."
    ),
) -> None:
    """Run an app with a sidecar next to it, both stopped together.

    bucketq run orders -c billing -- python worker.py

    The app finds the sidecar at $BUCKETQ_SIDECAR_URL (the bucketq clients read it); with
    --app-port the sidecar pushes messages to the app instead of waiting for pulls. The sidecar
    reaches the bucket with the same settings as every bucketq command (eval "$(bucketq dev)" for a
    local one). Both stop together; the exit code is the app's.
    """
    conn = connection(ctx)
    argv: list[str] = ctx.meta.get(COMMAND_KEY) or []
    try:
        if not argv:
            raise CliError("give the app's command after --: bucketq run [TOPIC]... -- python worker.py")
        timeout = parse_duration(ready_timeout)
        # as for the sidecar itself, the environment may name what it consumes
        topics = topics or [
            t.strip() for t in os.environ.get("BUCKETQ_SIDECAR_TOPICS", "").split(",") if t.strip()
        ]
        if app_port is not None and not topics:
            raise CliError(
                "--app-port (push mode) needs the topics to consume: bucketq run orders --app-port ..."
            )
        consumer = consumer or os.environ.get("BUCKETQ_SIDECAR_CONSUMER") or None
        group = consumer or (default_consumer(argv) if topics else None)
        engine = conn.settings()
    except Exception as exc:  # bad input, bad settings: one line, exit 2
        fail(exc, debug=conn.debug)
    code = run_app(engine_config(engine), argv, topics or [], group, app_port, app_path, port, timeout)
    raise typer.Exit(code)


def default_consumer(argv: list[str]) -> str:
    """A consumer name from the app's command, as a DNS-1123 label: the module of ``python -m M``,
    else the first ``*.py`` script, else the program (``worker`` for ``python examples/worker.py``)."""
    if "-m" in argv[:-1]:
        program = argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
    else:
        program = Path(next((w for w in argv if w.endswith(".py")), argv[0])).stem
    name = re.sub(r"[^a-z0-9-]+", "-", program.lower()).strip("-")
    return name or "app"


def engine_config(settings: Any) -> dict[str, Any]:
    """The resolved engine settings as the sidecar's YAML ``engine:`` section (secrets included)."""
    data: dict[str, Any] = settings.model_dump(mode="json", exclude_none=True)
    for key in ("s3_access_key_id", "s3_secret_access_key"):
        secret = getattr(settings, key)
        if secret is not None:
            data[key] = secret.get_secret_value()
    return data


def _pump(stream: IO[bytes], prefix: str) -> None:
    """Copy the sidecar's log to stderr, each line prefixed (like dapr run's)."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        sys.stderr.write(f"{prefix}{line}\n")
        sys.stderr.flush()


def _get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError):
        return 0, {}


@contextlib.contextmanager
def _sidecar_config(engine: dict[str, Any]) -> Iterator[Path]:
    """A private YAML file of the engine settings (it may hold credentials: mode 0600, removed after)."""
    with tempfile.TemporaryDirectory(prefix="bucketq-run-") as tmp:
        path = Path(tmp) / "sidecar.yaml"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump({"engine": engine}))
        yield path


def run_app(
    engine: dict[str, Any],
    argv: list[str],
    topics: list[str],
    consumer: str | None,
    app_port: int | None,
    app_path: str,
    port: int,
    ready_timeout: float,
) -> int:
    from bucketq.bench.servers import free_ports

    port = port or free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "bucketq.sidecar", "--listen-port", str(port), "--metrics-port", "0"]
    if consumer and topics:
        args += ["--consumer", consumer, "--topics", ",".join(topics)]
    if app_port is not None:
        args += ["--delivery", "push", "--app-port", str(app_port), "--app-path", app_path]
    # the engine settings come from the file, resolved as every bucketq command resolves them; the
    # environment's BUCKETQ_* engine variables would override it, so the sidecar does not see them
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("BUCKETQ_") or k.startswith("BUCKETQ_SIDECAR_")
    }
    with _sidecar_config(engine) as config:
        env = base | {"BUCKETQ_SIDECAR_CONFIG": str(config), "PYTHONUNBUFFERED": "1"}
        # the sidecar is stopped only once the app has exited: no app is left to settle what it
        # holds, so the drain would only wait (what it still holds is requeued at once)
        env.setdefault("BUCKETQ_SIDECAR_DRAIN_GRACE_S", "0")
        sidecar = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the app; the sidecar is stopped after it
            preexec_fn=die_with_parent,
        )
        assert sidecar.stdout is not None
        pump = threading.Thread(target=_pump, args=(sidecar.stdout, "sidecar | "), daemon=True)
        pump.start()
        try:
            what = f"consumer {consumer} of {', '.join(topics)}" if consumer and topics else "publish only"
            stderr().print(
                f"[dim]bucketq run: sidecar at {url} ({what}), pid {sidecar.pid}[/]", highlight=False
            )
            if not _wait_ready(url, sidecar, ready_timeout):
                return EXIT_ERROR
            return _run_app(argv, url, app_port, sidecar)
        finally:
            _stop_sidecar(sidecar)
            pump.join(5.0)  # the sidecar's last lines (how it stopped) before this process exits


def _wait_ready(url: str, sidecar: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    told = ""
    while True:
        if sidecar.poll() is not None:
            stderr().print(
                f"[bold red]error:[/] the sidecar exited with code {sidecar.returncode} (its log above)"
            )
            return False
        status, body = _get_json(url + "/readyz")
        if status == 200:
            return True
        _, detail = _get_json(url + "/v1/status")
        reason = str(detail.get("reason") or body.get("reason") or "")
        if time.monotonic() > deadline:
            stderr().print(
                f"[bold red]error:[/] the sidecar was not ready within {timeout:g}s: {reason or 'no answer'}",
                highlight=False,
            )
            return False
        if reason and reason != told and time.monotonic() > deadline - timeout + 2:
            stderr().print(f"[dim]bucketq run: waiting for the sidecar: {reason}[/]", highlight=False)
            told = reason
        time.sleep(POLL_S * 4)


def _run_app(argv: list[str], url: str, app_port: int | None, sidecar: subprocess.Popen[bytes]) -> int:
    env = dict(os.environ, BUCKETQ_SIDECAR_URL=url)
    if app_port is not None:
        env["BUCKETQ_APP_PORT"] = str(app_port)
    # The app shares this terminal's process group, so Ctrl-C reaches it directly; a signal sent
    # to bucketq run alone (kill, a supervisor) is passed on to it. The handlers are in place
    # before the app starts: a Ctrl-C while it starts must not end bucketq run (KeyboardInterrupt)
    # and leave the app running without its sidecar; it is passed on once the app exists.
    from_terminal = sys.stdin is not None and sys.stdin.isatty()
    app: subprocess.Popen[bytes] | None = None
    pending: int | None = None  # the first signal that came before the app existed

    def forward(signum: int, frame: object) -> None:
        nonlocal pending
        if app is None:
            pending = pending or signum
            return
        if signum == signal.SIGINT and from_terminal:
            return  # the app had it from the terminal too
        with contextlib.suppress(ProcessLookupError):
            app.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            app = subprocess.Popen(argv, env=env, preexec_fn=die_with_parent)
        except OSError as exc:
            stderr().print(f"[bold red]error:[/] cannot start {argv[0]}: {exc.strerror}", highlight=False)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        if pending is not None:
            with contextlib.suppress(ProcessLookupError):
                app.send_signal(pending)  # it came before the app: the app has it now, once
        while True:
            code = app.poll()
            if code is not None:
                return code if code >= 0 else 128 - code
            if sidecar.poll() is not None:
                stderr().print(
                    f"[bold red]error:[/] the sidecar exited with code {sidecar.returncode}: stopping the app",
                    highlight=False,
                )
                _stop(app, APP_STOP_GRACE_S)
                return EXIT_ERROR
            time.sleep(POLL_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(process: subprocess.Popen[Any], grace_s: float) -> int:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


def _stop_sidecar(sidecar: subprocess.Popen[bytes]) -> None:
    code = _stop(sidecar, SIDECAR_STOP_S)
    if code not in (0, -signal.SIGTERM):
        stderr().print(f"[yellow]warning:[/] the sidecar stopped with code {code}", highlight=False)
