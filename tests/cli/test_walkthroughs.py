"""The local walkthroughs of docs/, run exactly as written: the ``$ `` lines of their ``console``
blocks, in order, in one bash session (``eval "$(bucketq dev)"`` first, so they start from nothing
but this checkout), with each command's documented output checked against what it printed.

Output lines are matched loosely, in order, each against some later line of the command's
output: ``…`` stands for anything, a number or a duration (``32s``, ``1h30m``) for any other,
letters' case and runs of spaces do not count, and table rules (``───``) are skipped, so that a
page can show what a terminal shows while the test's stdout is a pipe. A line of its own ``…``
says that lines were left out. Walkthroughs that need Kubernetes are checked by
tests/ship/test_quickstart.py and tests/e2e.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGHS = ["docs/operations.md", "docs/sidecar-api.md"]
MARKER = "@@walkthrough-step@@"
FENCE = re.compile(r"^```(\S*)\s*$")
DURATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:ms|[smhdw])(?:\d+(?:ms|[smhd]))*(?![\w])")
NUMBER = re.compile(r"\d+")

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.s3]


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)
    line: int = 0


def steps(markdown: str) -> list[Step]:
    """The ``$ `` commands of every ``console`` block and the output lines shown under each."""
    out: list[Step] = []
    block: str | None = None
    for number, line in enumerate(markdown.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            block = fence[1] if block is None else None
            continue
        if block != "console":
            continue
        if line.startswith("$ "):
            out.append(Step(line[2:], line=number))
        elif out and line.strip():
            out[-1].expected.append(line)
    return out


def normalise(text: str) -> str:
    text = DURATION.sub("D", text.strip().lower())
    return " ".join(NUMBER.sub("0", text).split())


def pattern(expected: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in normalise(expected).split("…")]
    return re.compile(r"\s*" + ".*".join(p.replace(r"\ ", r"\s+") for p in parts) + r"\s*")


def check(step: Step, output: str, doc: str) -> None:
    lines = [normalise(line) for line in output.splitlines() if line.strip() and set(line.strip()) != {"─"}]
    at = 0
    for wanted in step.expected:
        if wanted.strip() == "…" or set(wanted.strip()) == {"─"}:
            continue
        regex = pattern(wanted)
        while at < len(lines) and not regex.fullmatch(lines[at]):
            at += 1
        assert at < len(lines), (
            f"{doc}:{step.line}: `{step.command}` did not print a line like\n  {wanted}\nit printed:\n{output}"
        )
        at += 1


def script(all_steps: list[Step]) -> str:
    """One bash session, fed on stdin: a command that starts a shell (``bucketq run -- bash``) reads
    the next lines itself, as it would from a person typing them."""
    body = ["set -eo pipefail", "exec 2>&1"]
    for i, step in enumerate(all_steps):
        body += [f"printf '\\n{MARKER}{i}\\n'", step.command]  # output may not end its last line
    body.append(f"printf '\\n{MARKER}end\\n'")
    return "\n".join(body) + "\n"


@pytest.mark.parametrize("doc", WALKTHROUGHS)
def test_walkthrough_runs_as_written(doc: str, tmp_path: Path) -> None:
    all_steps = steps((ROOT / doc).read_text())
    assert all_steps, f"{doc} has no console walkthrough"
    assert all_steps[0].command.startswith('eval "$(bucketq dev'), f"{doc} must start from bucketq dev"
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUCKETQ_", "AWS_", "XDG_"))}
    env.update(
        HOME=str(tmp_path / "home"),
        PATH=os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", ""))),
        PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH")))),
        COLUMNS="120",
    )
    try:
        run = subprocess.run(
            ["bash", "-s"],
            input=script(all_steps),
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=400,
        )
    finally:  # whatever happened, no dev server outlives the test
        subprocess.run(
            [sys.executable, "-m", "bucketq.cli", "dev", "--stop"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
    chunks = re.split(rf"^{MARKER}(\w+)\n", run.stdout, flags=re.MULTILINE)
    outputs = dict(zip(chunks[1::2], chunks[2::2], strict=True))
    failed = next(
        (s for i, s in enumerate(all_steps) if str(i + 1) not in outputs and str(i) in outputs), None
    )
    assert run.returncode == 0 and "end" in outputs, (
        f"{doc}: stopped at `{failed.command if failed else '?'}` (exit {run.returncode}):\n{run.stdout[-3000:]}"
    )
    for i, step in enumerate(all_steps):
        check(step, outputs[str(i)], doc)


def test_the_matcher_is_strict_where_it_must_be() -> None:
    step = Step(
        "bucketq dlq list",
        ["topic    dead-letter topic   dead letters   not redriven", "orders   orders.dlq   20   20"],
    )
    check(step, "TOPIC   DEAD-LETTER TOPIC   DEAD LETTERS   NOT REDRIVEN\norders   orders.dlq   7   7\n", "t")
    with pytest.raises(AssertionError):
        check(
            step, "TOPIC   DEAD-LETTER TOPIC   DEAD LETTERS   NOT REDRIVEN\norders   other.dlq   7   7\n", "t"
        )
    with pytest.raises(AssertionError):  # in order
        check(
            step,
            "orders   orders.dlq   7   7\nTOPIC   DEAD-LETTER TOPIC   DEAD LETTERS   NOT REDRIVEN\n",
            "t",
        )
    check(
        Step("x", ["idle 32s", 'p2@0 2026-11-26 14:49:17 01a2… {"n": 1}']),
        'idle 1m6s\np3@12 2026-01-02 03:04:05 01a2ff-x {"n": 77}\n',
        "t",
    )
