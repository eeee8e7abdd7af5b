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


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds used so far by ``root`` (default: this process) and all its descendants."""
    root = os.getpid() if root is None else root
    if not os.path.isdir("/proc"):
        times = os.times()
        return times.user + times.system + times.children_user + times.children_system
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                stats[int(name)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


@dataclass
class Measured:
    """Wall and process-tree CPU seconds of a block."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextmanager
def measured() -> Iterator[Measured]:
    """Measure the block: ``with measured() as m: ...`` then ``m.wall_s``, ``m.cpu_s``."""
    out = Measured()
    cpu, wall = tree_cpu_seconds(), time.perf_counter()
    try:
        yield out
    finally:
        out.wall_s = time.perf_counter() - wall
        out.cpu_s = tree_cpu_seconds() - cpu
