"""The bounded simulation batch (CI), and the determinism the simulator promises.

``test_schedules_hold_every_invariant`` runs ``BUCKETQ_SIM_SEEDS`` schedules (default 500) on
every core; a failure lists each failing seed with its violations and the command that reruns it.
``make soak SEEDS=...`` runs many more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .__main__ import rerun_command
from .history import digest
from .runner import run_many, run_schedule
from .schedule import FAMILIES, make_schedule

ROOT = Path(__file__).resolve().parents[2]
SEEDS = int(os.environ.get("BUCKETQ_SIM_SEEDS", "500"))
START = int(os.environ.get("BUCKETQ_SIM_START", "0"))


@pytest.mark.slow
@pytest.mark.timeout(900)  # about a minute on two idle cores; a loaded machine needs more room
def test_schedules_hold_every_invariant() -> None:
    started = time.perf_counter()
    summaries = run_many(range(START, START + SEEDS), jobs=os.cpu_count() or 1)
    elapsed = time.perf_counter() - started
    assert len(summaries) == SEEDS
    failures = [s for s in summaries if not s["ok"]]
    lines = []
    for s in failures:
        kinds = sorted({v["invariant"] for v in s["violations"]}) or ["simulator error"]
        first = s["violations"][0]["message"] if s["violations"] else (s["error"] or "").strip().splitlines()[-1]
        lines.append(f"seed {s['seed']} ({s['family']}) {', '.join(kinds)} [{', '.join(s['flaws'])}]: {first}\n"
                     f"    rerun: {rerun_command(s['seed'], None, None)}")
    print(f"{SEEDS} schedules in {elapsed:.1f}s ({SEEDS / elapsed:.1f}/s)")
    assert not failures, f"{len(failures)} of {SEEDS} schedules failed:\n" + "\n".join(lines)


@pytest.mark.parametrize("family", ["mixed", "stale_tail", "paused_prefetch", "lost_commit", "topic_churn"])
def test_a_seed_replays_the_same_history(family: str) -> None:
    first = run_schedule(7, family)
    second = run_schedule(7, family)
    assert first.error is None and second.error is None
    assert len(first.events) > 50  # the schedule did something
    assert first.digest == second.digest == digest(second.events)
    assert first.injected == second.injected


def test_a_seed_replays_across_processes() -> None:
    """The CLI's rerun command gives the same history in a new interpreter (PYTHONHASHSEED fixed)."""
    digests = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-m", "tests.sim", "--seed", "3", "--family", "mixed", "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        digests.append(json.loads(out.stdout)["runs"][0]["digest"])
    assert digests[0] == digests[1] != ""


def test_every_family_is_drawn_from_seeds() -> None:
    drawn = {make_schedule(seed).family for seed in range(300)}
    assert drawn == set(FAMILIES)
