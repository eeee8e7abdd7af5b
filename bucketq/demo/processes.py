"""The sidecar demo's child processes: the sidecar and the example worker app, each with a log file.

Children run this very bucketq (``PYTHONPATH``) in their own session, so that Ctrl-C reaches only
the demo, which then stops them in order; Linux also SIGTERMs them should the demo die abruptly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import bucketq
from bucketq.bench.servers import die_with_parent

SOURCE_ROOT = Path(bucketq.__file__).resolve().parents[1]
EXAMPLE_WORKER = SOURCE_ROOT / "examples" / "worker.py"


@dataclass
class Child:
    """A running child process and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def last_line(self, prefix: str) -> str | None:
        """The last line of the log that starts with ``prefix``."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        return next((line for line in reversed(text.splitlines()) if line.startswith(prefix)), None)

    def stop(self, timeout_s: float, *, grace_s: float = 0.0) -> int:
        """Wait ``grace_s`` for an exit, SIGTERM, SIGKILL after ``timeout_s``; the exit code (<0: signal)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(grace_s)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without ``AWS_*``/``BUCKETQ_*``, importing this bucketq, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BUCKETQ_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH")) if p)
    env.update(AWS_EC2_METADATA_DISABLED="true", PYTHONUNBUFFERED="1", **extra)
    return env


def spawn(name: str, args: list[str], workdir: Path, env: dict[str, str]) -> Child:
    """Start ``args`` in a new session with output to ``workdir/<name>.log`` (call from the main thread)."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
    return Child(name, process, log_path)


def start_sidecar(workdir: Path, env: dict[str, str]) -> Child:
    """``python -m bucketq.sidecar`` configured by ``env`` (``BUCKETQ_SIDECAR_*`` and ``BUCKETQ_*``)."""
    return spawn("sidecar", [sys.executable, "-m", "bucketq.sidecar"], workdir, child_env(env))


def start_worker(workdir: Path, worker: Path, ledger: Path, args: list[str]) -> Child:
    """The worker app ``worker`` with ``args``, its acks written to ``ledger`` (see ``worker_tap``)."""
    command = [sys.executable, "-m", "bucketq.demo.worker_tap", str(ledger), str(worker), *args]
    return spawn("worker", command, workdir, child_env({}))
