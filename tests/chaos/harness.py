"""The chaos controller: every role as an OS process, kill -9 / SIGSTOP chaos, quiesce, snapshot, check.

Phases (recorded as ``phase`` events in the controller's own history file):

1. **setup**: producers, members and GC start (import, connect) while one setup process creates
   the topic and every group's subscription (earliest); they begin once it is done, so every
   publish is covered by every group. The chaos starts when each has done its first piece of work.
2. **chaos** (``seconds``): every ``action_every_s`` the controller kill -9's a random producer,
   member or GC process (restarted after a short delay as a new incarnation: a new member id) or
   SIGSTOPs one for longer than the visibility timeout plus the clock-skew margin (so the leases it
   holds expire while it is stopped, and its fence copies go stale) and SIGCONTs it on time.
   The first actions kill a member, a producer and GC and pause GC, a member and a producer. The
   helpers of the later phases (a fresh member per group, a probe, the snapshot) start now and
   wait for their turn, so that their start-up is not on those phases' clocks.
3. **quiesce**: no new chaos; pending restarts happen at once, pauses end on time; producers
   stop publishing and exit; members ack everything; the fresh members join (new member ids).
   It ends when no settlement is open and the histories show every message acked OK in every
   group, or (when a killed process's ack may have landed unseen) the probe, in a look that began
   after the last producer exited, finds every group's backlog, in-flight and delayed counts at
   zero; or after ``quiesce_s`` (the check then reports what is left). If GC has freed no segment yet, it gets
   one more grace period (a short chaos run may end before any fence is a grace old).
4. **stop / final**: GC is killed (it is crash-safe); members stop claiming, finish their handlers
   and leave; then each member records its cursor replicas (no writer is left, so they must equal
   a fresh load) and exits, and the snapshot records fresh cursor loads, floor fences, the stored
   segments and the engine's statistics.

A failure of the run itself (a process that must succeed did not) is reported with the checks of
the histories recorded so far: they usually say why.

Every process gets ``BUCKETQ_FENCE_SCALE`` so that GC frees during the run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from bucketq.bench.servers import _clean_env

from . import histories
from .worker import Recorder

REPO = Path(__file__).resolve().parents[2]
TOPIC = "chaos"


@dataclass
class ChaosPlan:
    """What one chaos run does. ``settings`` reaches the bucket (file backend or an S3 server)."""

    settings: dict[str, Any]
    seconds: float = 15.0
    seed: int = 0
    producers: int = 3
    producer_lanes: int = 1
    # a rate the members of each group keep up with on a loaded 2-core machine (the quiesce
    # phase is short when the backlog is)
    publish_gap_s: tuple[float, float] = (0.05, 0.25)
    groups: tuple[str, ...] = ("g1", "g2")
    members_per_group: int = 2
    partitions: int = 3
    retention_s: float = 1.0
    visibility_timeout_s: float = 3.0
    clock_skew_s: float = 0.25
    fence_scale: float = 0.01
    gc_interval_s: tuple[float, float] = (0.3, 1.0)
    action_every_s: tuple[float, float] = (0.7, 1.5)
    restart_after_s: tuple[float, float] = (0.2, 1.5)
    max_paused: int = 2
    quiesce_s: float = 60.0
    gc_wait_s: float = 30.0  # after the drain, at most this (plus a segment grace) for GC to free
    # longer than the publish timeout (60 s): a publish that gives up on time is not a hang
    hang_limit_s: float = 90.0
    member_plan: dict[str, float] = field(
        default_factory=lambda: {"ack": 0.80, "nack": 0.07, "extend": 0.07, "slow": 0.03, "drop": 0.03}
    )

    def pause_s(self, rng: random.Random) -> float:
        """Longer than a lease can outlive its holder: visibility timeout plus the skew margin."""
        return self.visibility_timeout_s + self.clock_skew_s + rng.uniform(0.5, 4.5)

    def consumer(self) -> dict[str, Any]:
        return {
            "visibility_timeout_s": self.visibility_timeout_s,
            "clock_skew_s": self.clock_skew_s,
            "max_in_flight": 20,
            "poll_min_ms": 10,
            "poll_max_ms": 50,
            "poll_idle_ms": 200,
            "heartbeat_interval_s": 0.5,
            "member_ttl_s": 3.0,
            "steal_after_s": 1.0,
            "foreign_poll_ms": 200,
            "foreign_poll_max_s": 1.5,
            # frequent checkpoints: GC raises trim fences and frees deltas within the run
            "checkpoint_every": 8,
        }


@dataclass
class Role:
    """A logical process of the deployment; each (re)start is a new incarnation ``name#n``."""

    name: str
    kind: str  # producer | member | gc | probe | snapshot
    args: list[str] = field(default_factory=list)
    incarnation: int = 0
    proc: str = ""
    popen: subprocess.Popen[bytes] | None = None
    paused_until: float | None = None  # monotonic
    restart_at: float | None = None  # monotonic
    expect_exit: bool = False
    chaos: bool = True  # killed and paused by the controller (the quiesce helpers are not)

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class ChaosResult:
    run_dir: Path
    seed: int
    events: list[dict[str, Any]]
    violations: list[histories.Violation]
    pending: list[tuple[str, dict[str, Any], dict[str, Any]]]
    summary: dict[str, Any]
    probe: dict[str, Any]
    wall_s: float
    partial_lines: int
    error: str | None = None  # the run itself could not finish (its histories are checked anyway)

    def report(self) -> str:
        lines = [
            f"chaos run seed={self.seed} wall={self.wall_s:.1f}s dir={self.run_dir}",
            f"partial last lines dropped: {self.partial_lines}",
            f"final probe: {self.probe}",
        ]
        if self.error:
            lines.append(f"THE RUN FAILED: {self.error}")
        lines += [f"  {k}: {v}" for k, v in self.summary.items()]
        lines.append(
            f"violations: {len(self.violations)}; acknowledged publishes still pending: {len(self.pending)}"
        )
        shown: dict[str, int] = {}
        for v in self.violations:
            shown[v.invariant] = shown.get(v.invariant, 0) + 1
            if shown[v.invariant] > 3:
                continue  # the first few of each kind (all of them are in result.json)
            lines.append(f"  [{v.invariant}] {v.message}")
            lines += [f"      {json.dumps(e, sort_keys=True)[:400]}" for e in v.events[:4]]
        lines += [f"  ({n - 3} more {name})" for name, n in shown.items() if n > 3]
        for group, call, ret in self.pending[:10]:
            lines.append(
                f"  pending in {group}: {call['tag']} at p{ret['partition']}/{ret['seq']}/{ret['index']}"
            )
        return "\n".join(lines)


class Chaos:
    """Runs one :class:`ChaosPlan` in ``run_dir`` (see the module docstring)."""

    def __init__(self, plan: ChaosPlan, run_dir: Path) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.rng = random.Random(f"chaos/{plan.seed}")
        for sub in ("history", "logs", "probe"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.epoch = time.time()
        self.rec = Recorder(run_dir / "history" / "controller.jsonl", "controller", self.epoch)
        self.env = _clean_env() | {
            "BUCKETQ_FENCE_SCALE": str(plan.fence_scale),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        self.roles: list[Role] = []
        self.spawned: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self.probes = 0
        self.last_probe: dict[str, Any] = {}

    # -- processes -----------------------------------------------------------------------------

    def _popen(self, kind: str, proc: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.run_dir / "logs" / f"{proc}.log", "wb")  # noqa: SIM115  (closed in cleanup)
        self._logs.append(log)
        popen = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.worker", kind, str(self.run_dir), proc, *args],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.spawned.append(popen)
        return popen

    def start(self, role: Role) -> None:
        role.incarnation += 1
        role.proc = f"{role.name}#{role.incarnation}"
        role.popen = self._popen(role.kind, role.proc, role.args)
        role.restart_at = None
        role.paused_until = None
        if role.incarnation > 1:
            self.rec.record("restart", proc=role.proc)

    def run_once(self, kind: str, proc: str, timeout: float = 60.0) -> None:
        """A one-shot process (the setup) that must succeed."""
        popen = self._popen(kind, proc, [])
        try:
            code = popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
            raise RuntimeError(f"{proc} did not finish within {timeout}s: {self._tail(proc)}") from None
        if code != 0:
            raise RuntimeError(f"{proc} failed with exit code {code}: {self._tail(proc)}")

    def _tail(self, proc: str, lines: int = 15) -> str:
        try:
            text = (self.run_dir / "logs" / f"{proc}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self, role: Role, *, restart: bool = True, reason: str = "chaos") -> None:
        assert role.popen is not None
        role.popen.send_signal(signal.SIGKILL)
        role.popen.wait()
        self.rec.record("crash", proc=role.proc, signal="SIGKILL", reason=reason)
        role.popen = None
        role.paused_until = None
        if restart:
            role.restart_at = time.monotonic() + self.rng.uniform(*self.plan.restart_after_s)

    def pause(self, role: Role, seconds: float) -> None:
        assert role.popen is not None
        role.popen.send_signal(signal.SIGSTOP)
        # ``until`` in history time: the checker does not count a paused process's time as a hang
        self.rec.record("pause", proc=role.proc, until=round(time.time() - self.epoch + seconds, 6))
        role.paused_until = time.monotonic() + seconds

    def resume(self, role: Role) -> None:
        if role.popen is not None:
            role.popen.send_signal(signal.SIGCONT)
            self.rec.record("resume", proc=role.proc)
        role.paused_until = None

    def tick(self, *, restarts: bool = True) -> None:
        """Pauses end on time, restarts happen when due, and an exit nobody asked for is recorded
        (an engine_alive violation: the application died) and restarted."""
        now = time.monotonic()
        for role in self.roles:
            if role.paused_until is not None and now >= role.paused_until:
                self.resume(role)
            if role.popen is not None and role.popen.poll() is not None:
                code = role.popen.returncode
                if code != 0:
                    self.rec.record(
                        "proc_error", proc=role.proc, error=f"exit code {code}", msg=self._tail(role.proc, 5)
                    )
                role.popen = None
                role.paused_until = None
                if not role.expect_exit and restarts:
                    role.restart_at = now
            if role.restart_at is not None and now >= role.restart_at and restarts:
                self.start(role)

    def cleanup(self) -> None:
        """Only the processes this run started, each by its own handle."""
        for popen in self.spawned:
            if popen.poll() is None:
                popen.send_signal(signal.SIGKILL)
                popen.wait()
        for log in self._logs:
            log.close()

    # -- the run -------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        p = self.plan
        return {
            "epoch": self.epoch,
            "seed": p.seed,
            "settings": p.settings,
            "topic": TOPIC,
            "partitions": p.partitions,
            "retention_s": p.retention_s,
            "groups": list(p.groups),
            "fence_scale": p.fence_scale,
            "publish_gap_s": list(p.publish_gap_s),
            "producer_lanes": p.producer_lanes,
            "gc_interval_s": list(p.gc_interval_s),
            "consumer": p.consumer(),
            "member_plan": p.member_plan,
        }

    def run(self) -> ChaosResult:
        started = time.monotonic()
        error = None
        try:
            self._run()
        except Exception as exc:  # the histories so far still say what happened, and why
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self.cleanup()
        merged = histories.load_dir(self.run_dir / "history")
        violations = histories.check(merged.events)
        _, pending = histories.settlement(histories.Index(merged.events))
        summary = histories.summarize(merged.events)
        summary["probes"] = self.probes
        result = ChaosResult(
            run_dir=self.run_dir,
            seed=self.plan.seed,
            events=merged.events,
            violations=violations,
            pending=pending,
            summary=summary,
            probe=self.last_probe,
            wall_s=time.monotonic() - started,
            partial_lines=merged.partial_lines,
            error=error,
        )
        (self.run_dir / "result.json").write_text(
            json.dumps(
                {
                    "seed": result.seed,
                    "wall_s": result.wall_s,
                    "error": error,
                    "summary": summary,
                    "probe": self.last_probe,
                    "partial_lines": result.partial_lines,
                    "violations": [v.to_json() for v in violations],
                    "pending": len(pending),
                },
                indent=1,
                default=str,
            )
        )
        return result

    def _run(self) -> None:
        p = self.plan
        (self.run_dir / "config.json").write_text(json.dumps(self.config(), indent=1))
        params = {k: v for k, v in asdict(p).items() if k != "settings"} | {
            "backend": p.settings.get("backend"),
            "topics": [{"name": TOPIC, "max_deliveries": 1000}],
        }
        self.rec.record("run", seed=p.seed, family="chaos", epoch=self.epoch, params=params)
        self.rec.record("phase", name="setup")
        self.roles = [Role(f"prod{i}", "producer") for i in range(p.producers)]
        self.roles += [
            Role(f"{g}.m{j}", "member", ["--group", g]) for g in p.groups for j in range(p.members_per_group)
        ]
        self.roles.append(Role("gc", "gc"))
        # the roles start (import, connect) while the setup runs; they wait for "ready" to begin
        for role in self.roles:
            self.start(role)
        self.run_once("setup", "setup")
        (self.run_dir / "ready").touch()
        self._wait_ready(timeout=90.0)
        # the helpers of the last phases: a fresh member per group (it joins only when the quiesce
        # begins: a new member id), the probe and the snapshot; they start during the chaos so
        # that their start-up is off the clock of the phases that need them
        helpers = [Role(f"{g}.q", "member", ["--group", g, "--drainer"], chaos=False) for g in p.groups]
        helpers += [Role("probe", "probe", chaos=False), Role("snapshot", "snapshot", chaos=False)]
        for role in helpers:
            self.roles.append(role)
            self.start(role)
        self.rec.record("phase", name="chaos")
        self._chaos()
        self.rec.record("phase", name="quiesce")
        self._quiesce()
        self.rec.record("phase", name="stop")
        self._stop()
        self.rec.record("phase", name="final")
        self._snapshot()
        self.rec.record("phase", name="end")

    def _wait_ready(self, timeout: float) -> None:
        """Chaos starts once every producer has published and every member has joined."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            events = histories.load_dir(self.run_dir / "history").events
            done = {e["proc"] for e in events if e["ev"] == "ret" and e["outcome"] == "ok"}
            if all(r.proc in done for r in self.roles if r.kind != "gc" and r.chaos):
                return
            time.sleep(0.25)
        raise RuntimeError(
            "processes did not start within the time limit: "
            + "; ".join(f"{r.proc}: {self._tail(r.proc, 3)}" for r in self.roles)
        )

    def _chaos(self) -> None:
        p = self.plan
        # every kind of action on every kind of process happens early in every run
        opening = [
            ("kill", "member"),
            ("pause", "member"),
            ("kill", "producer"),
            ("kill", "gc"),
            ("pause", "gc"),
            ("pause", "producer"),
        ]
        end = time.monotonic() + p.seconds
        next_action = time.monotonic() + self.rng.uniform(*p.action_every_s)
        while time.monotonic() < end:
            self.tick()
            if time.monotonic() >= next_action:
                if opening:
                    action, kind = opening[0]
                else:
                    action = self.rng.choice(["kill", "pause"])
                    kind = self.rng.choices(["member", "producer", "gc"], weights=[0.55, 0.35, 0.10])[0]
                # an opening action that cannot happen yet (too many paused) is tried again next time
                if self._act(action, kind) and opening:
                    opening.pop(0)
                next_action = time.monotonic() + self.rng.uniform(*p.action_every_s)
            time.sleep(0.05)

    def _act(self, action: str, kind: str) -> bool:
        paused = sum(1 for r in self.roles if r.paused_until is not None)
        eligible = [
            r for r in self.roles if r.kind == kind and r.chaos and r.alive and r.paused_until is None
        ]
        if not eligible or (action == "pause" and paused >= self.plan.max_paused):
            return False
        role = self.rng.choice(eligible)
        if action == "kill":
            self.kill(role)
        else:
            self.pause(role, self.plan.pause_s(self.rng))
        return True

    def _quiesce(self) -> None:
        p = self.plan
        (self.run_dir / "quiesce").touch()
        for role in self.roles:
            if role.restart_at is not None:
                role.restart_at = time.monotonic()
            if role.kind == "producer":
                role.expect_exit = True
        deadline = time.monotonic() + p.quiesce_s
        producers_gone: float | None = None
        look = 0.0  # how long reading the histories takes (a long soak's are large): poll no faster
        while time.monotonic() < deadline:
            self.tick()
            time.sleep(max(0.3, 2 * look))
            if any(r.paused_until is not None for r in self.roles):
                continue
            if any(r.kind == "producer" and (r.alive or r.restart_at is not None) for r in self.roles):
                continue
            if producers_gone is None:
                producers_gone = time.time() - self.epoch
            began = time.monotonic()
            missing, open_calls = histories.outstanding(histories.load_dir(self.run_dir / "history").events)
            look = time.monotonic() - began
            if open_calls:
                continue
            # the histories show every message acked; or they cannot (an ack whose process was
            # killed before it returned may have landed): then the bucket decides
            if missing == 0 or self._probe_drained(after=producers_gone):
                self.rec.record(
                    "drained", by="histories" if missing == 0 else "probe", unacked_in_history=missing
                )
                self._let_gc_free()
                return

    def _let_gc_free(self) -> None:
        """GC frees little while traffic moves the floors (it rewrites its fences at every
        collection and frees only below a fence a whole grace old): once drained, the floors stand
        still, and GC gets one segment grace plus a few collections (slow ones on a loaded machine)
        to free what the run consumed, if it has freed nothing yet."""
        wait_until = time.monotonic() + 300.0 * self.plan.fence_scale + self.plan.gc_wait_s
        while time.monotonic() < wait_until:
            events = histories.load_dir(self.run_dir / "history").events
            if any(e["ev"] == "ret" and e["proc"].startswith("gc") and e.get("segments") for e in events):
                return
            self.tick()
            time.sleep(0.3)

    def _probe_drained(self, after: float) -> bool:
        """Whether a look at the bucket that began after ``after`` (history time) found every
        group's backlog, in-flight and delayed counts at zero."""
        role = next(r for r in self.roles if r.kind == "probe")
        try:
            probe = json.loads((self.run_dir / "probe" / f"{role.proc}.json").read_text())
        except (OSError, ValueError):
            return False
        self.probes += 1
        self.last_probe = probe["groups"]
        return probe["t"] > after and all(
            s["backlog"] == 0 and s["in_flight"] == 0 and s["delayed"] == 0 for s in self.last_probe.values()
        )

    def _stop(self) -> None:
        (self.run_dir / "stop").touch()
        snapshot = next(r for r in self.roles if r.kind == "snapshot")
        for role in self.roles:
            role.expect_exit = True
            role.restart_at = None
            if role.paused_until is not None:
                self.resume(role)
            if role.kind == "gc" and role.alive:
                # GC is crash-safe (the chaos kills it anyway): waiting for a slow collection to end
                # would only cost time
                self.kill(role, restart=False, reason="stop")
        members = [r for r in self.roles if r.kind == "member" and r.alive]
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            self.tick(restarts=False)
            events = histories.load_dir(self.run_dir / "history").events
            idle = {e["proc"] for e in events if e["ev"] == "idle"}
            if all(r.proc in idle or not r.alive for r in members):
                break
            time.sleep(0.2)
        # every member has left the group: no cursor writer is left, so the replicas each member
        # records now must equal the fresh loads the snapshot takes after they exit
        (self.run_dir / "final").touch()
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and any(r.alive for r in self.roles if r is not snapshot):
            self.tick(restarts=False)
            time.sleep(0.1)
        for role in self.roles:
            if role.alive and role is not snapshot:
                self.kill(role, restart=False, reason="did not exit when stopped")

    def _snapshot(self) -> None:
        """The snapshot process (started with the others) looks at the bucket now."""
        role = next(r for r in self.roles if r.kind == "snapshot")
        (self.run_dir / "snapshot").touch()
        assert role.popen is not None, "the snapshot process died before its turn"
        try:
            code = role.popen.wait(timeout=120.0)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{role.proc} did not finish: {self._tail(role.proc)}") from None
        if code != 0:
            raise RuntimeError(f"{role.proc} failed with exit code {code}: {self._tail(role.proc)}")
