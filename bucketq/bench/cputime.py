"""CPU seconds of this process and every process under it (Linux ``/proc``).

Wall time on a shared machine swings with the load; the CPU time a piece of work costs does not.
A benchmark of Spark jobs measures the whole tree: the driver, its JVM, the Python workers the JVM
starts, and the S3 server when the benchmark started it. Processes that exited count once their
parent reaped them (the kernel adds their time to the parent's ``cutime``/``cstime``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / _TICKS


def tree_cpu_by_process(root: int | None = None) -> dict[int, float]:
    """CPU seconds used so far by ``root`` (default: this process) and each of its descendants."""
    root = os.getpid() if root is None else root
    if not os.path.isdir("/proc"):
        times = os.times()
        return {root: times.user + times.system + times.children_user + times.children_system}
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                stats[int(name)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            tree[pid] = stats[pid][1]
        todo.extend(children.get(pid, []))
    return tree


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds used so far by ``root`` (default: this process) and all its descendants."""
    return sum(tree_cpu_by_process(root).values())


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the tree used between two readings, never negative.

    A descendant that leaves the tree unreaped by it (orphaned to init, like a killed Spark
    driver's JVM) takes its time with it: subtracting whole-tree totals then goes negative. So each
    process counts only what it gained, and a process that left counts nothing."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


@dataclass
class Measured:
    """Wall and process-tree CPU seconds of a block."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextmanager
def measured() -> Iterator[Measured]:
    """Measure the block: ``with measured() as m: ...`` then ``m.wall_s``, ``m.cpu_s``."""
    out = Measured()
    cpu, wall = tree_cpu_by_process(), time.perf_counter()
    try:
        yield out
    finally:
        out.wall_s = time.perf_counter() - wall
        out.cpu_s = cpu_since(cpu, tree_cpu_by_process())
