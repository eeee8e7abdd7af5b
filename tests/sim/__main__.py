"""``python -m tests.sim``: run simulation schedules and report what they covered and found.

    python -m tests.sim --seeds 1000            # seeds 0..999, on every core
    python -m tests.sim --seeds 200 --start 5000
    python -m tests.sim --seed 42 --history h.jsonl   # one seed, its history written out
    python -m tests.sim --seeds 300 --family long_outage
    python -m tests.sim --seeds 1000 --engine /path/to/other/checkout   # test another engine

For every failing seed it prints the violated invariants, their events and the command that
reruns that seed alone. Histories replay exactly: the command re-executes itself with
``PYTHONHASHSEED=0`` so that even set iteration order is the same in every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any

COVERAGE_KEYS = {
    "processes": "processes (actor incarnations)",
    "call:publish": "publishes",
    "deliver": "deliveries",
    "deliver:standing": "of them under a standing claim",
    "call:ack": "acks",
    "call:nack": "nacks",
    "call:extend": "extends",
    "call:join": "member joins",
    "call:leave": "member leaves",
    "call:gc": "GC runs",
    "crash": "crashes",
    "restart": "restarts",
    "pause": "pauses",
    "pause>20min": "pauses > 20 min",
    "outage": "outages",
    "call:grow": "partition growths",
    "call:delete_topic": "topic deletions",
    "error:LeaseLost": "lease-lost answers",
}


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="how many schedules to run (default 100)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--seed", type=int, help="run this one seed only (verbose)")
    ap.add_argument("--family", help="force a scenario family (see tests/sim/schedule.py FAMILIES)")
    ap.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON summary instead of text")
    ap.add_argument("--history", help="with --seed: write the history (JSON lines) to this file")
    ap.add_argument("--engine", help="import bucketq from this directory (e.g. a baseline worktree)")
    ap.add_argument("--show", type=int, default=3, help="violations shown per failing seed (default 3)")
    return ap.parse_args(argv)


def _reexec_with_fixed_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, "-m", "tests.sim", *sys.argv[1:]], env)


def rerun_command(seed: int, family: str | None, engine: str | None) -> str:
    parts = ["PYTHONHASHSEED=0", ".venv/bin/python", "-m", "tests.sim", "--seed", str(seed)]
    if family:
        parts += ["--family", family]
    if engine:
        parts += ["--engine", engine]
    return " ".join(parts)


def _event_line(e: dict[str, Any]) -> str:
    text = json.dumps(e, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 400 else text[:397] + "..."


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.engine:
        sys.path.insert(0, os.path.abspath(args.engine))
    import bucketq  # after --engine: the engine under test

    from .runner import run_many, run_schedule

    engine_note = os.path.dirname(os.path.dirname(os.path.abspath(bucketq.__file__)))
    if args.seed is not None:
        result = run_schedule(args.seed, args.family)
        if args.history:
            from .history import to_jsonl

            with open(args.history, "w") as f:
                f.write(to_jsonl(result.events))
        summaries = [result.summary()]
        seeds = [args.seed]
    else:
        seeds = list(range(args.start, args.start + args.seeds))
        summaries = []
    started = time.perf_counter()
    if args.seed is None:
        done = [0]

        def progress(_s: dict[str, Any]) -> None:
            done[0] += 1
            if not args.json and sys.stderr.isatty() and done[0] % 20 == 0:
                print(f"\r{done[0]}/{len(seeds)}", end="", file=sys.stderr, flush=True)

        summaries = run_many(seeds, family=args.family, jobs=args.jobs, on_result=progress)
        if not args.json and sys.stderr.isatty():
            print("\r", end="", file=sys.stderr)
    elapsed = max(time.perf_counter() - started, 1e-9) if args.seed is None else summaries[0]["wall_s"]
    failures = [s for s in summaries if not s["ok"]]
    injected: Counter[str] = Counter()
    covered: Counter[str] = Counter()
    families: Counter[str] = Counter()
    by_invariant: Counter[str] = Counter()
    first_by_flaw: dict[str, int] = {}
    for s in summaries:
        injected.update(s["injected"])
        covered.update(s["coverage"])
        families[s["family"]] += 1
        for inv in {v["invariant"] for v in s["violations"]}:
            by_invariant[inv] += 1
        if s["error"]:
            by_invariant["simulator_error"] += 1
        for flaw in s.get("flaws", []):
            first_by_flaw.setdefault(flaw, s["seed"])
    if args.json:
        print(
            json.dumps(
                {
                    "engine": engine_note,
                    "schedules": len(summaries),
                    "seconds": round(elapsed, 2),
                    "schedules_per_s": round(len(summaries) / elapsed, 2),
                    "failures": len(failures),
                    "failing_seeds": [s["seed"] for s in failures],
                    "by_invariant": dict(by_invariant),
                    "first_seed_by_flaw": first_by_flaw,
                    "families": dict(families),
                    "injected": dict(injected),
                    "coverage": dict(covered),
                    "runs": summaries if args.seed is not None else [s for s in summaries if not s["ok"]],
                },
                indent=1,
            )
        )
        return 1 if failures else 0
    print(f"engine: {engine_note}")
    print(
        f"{len(summaries)} schedules in {elapsed:.1f}s ({len(summaries) / elapsed:.1f} schedules/s), "
        f"{sum(s['virtual_s'] for s in summaries) / 3600:.1f} virtual hours"
    )
    print("families: " + ", ".join(f"{k} {v}" for k, v in sorted(families.items())))
    print("faults injected: " + (", ".join(f"{k} {v}" for k, v in sorted(injected.items())) or "none"))
    print("covered: " + ", ".join(f"{label} {covered[key]}" for key, label in COVERAGE_KEYS.items()))
    if not failures:
        print("all invariants held")
        return 0
    print(
        f"\n{len(failures)} failing schedule(s); by invariant: "
        + ", ".join(f"{k} {v}" for k, v in by_invariant.most_common())
    )
    print(
        "first failing seed by flaw class (triage): "
        + ", ".join(f"{k} {v}" for k, v in sorted(first_by_flaw.items()))
    )
    for s in failures:
        print(
            f"\nseed {s['seed']} ({s['family']}): "
            + (", ".join(sorted({v["invariant"] for v in s["violations"]})) or "simulator error")
            + (f"  [looks like: {', '.join(s['flaws'])}]" if s.get("flaws") else "")
        )
        if s["error"]:
            print("  " + s["error"].replace("\n", "\n  "))
        for v in s["violations"][: args.show]:
            print(f"  [{v['invariant']}] {v['message']}")
            for e in v["events"][:4]:
                print(f"      {_event_line(e)}")
        if len(s["violations"]) > args.show:
            print(f"  ... {len(s['violations']) - args.show} more violation(s)")
        print(f"  rerun: {rerun_command(s['seed'], args.family, args.engine)}")
    return 1


if __name__ == "__main__":
    _reexec_with_fixed_hash_seed()
    sys.exit(main())
