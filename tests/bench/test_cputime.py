"""The process-tree CPU meter the Spark benchmark reports: children count, and a descendant that
leaves the tree without being reaped by it (a killed Spark driver's JVM, orphaned to init) never
makes a reading negative."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bucketq.bench.cputime import cpu_since, measured, tree_cpu_by_process

# The child forks a grandchild that burns 0.6 CPU-seconds then sleeps; the child then sleeps too.
# Killing the child leaves the grandchild to init: out of this process's tree, its time not added
# to any process in it.
_PARENT_OF_A_BUSY_GRANDCHILD = """
import os, sys, time
pid = os.fork()
if pid == 0:
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    time.sleep(120)
    os._exit(0)
print(pid, flush=True)
time.sleep(120)
"""


def test_a_grandchild_leaving_the_tree_during_a_block_is_not_subtracted() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _PARENT_OF_A_BUSY_GRANDCHILD], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while tree_cpu_by_process().get(grandchild, 0.0) < 0.55 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = tree_cpu_by_process()
        assert before.get(grandchild, 0.0) >= 0.55  # the grandchild's time is the tree's now
        with measured() as m:
            child.kill()
            child.wait()  # reaped by us; the grandchild is init's now
            while grandchild in tree_cpu_by_process() and time.monotonic() < deadline:
                time.sleep(0.01)
            sum(i * i for i in range(300_000))
        after = tree_cpu_by_process()
        assert grandchild not in after
        assert sum(after.values()) - sum(before.values()) < 0  # whole-tree totals went negative
        assert m.cpu_s > 0 and cpu_since(before, after) > 0
    finally:
        child.kill()
        child.wait()
        try:
            os.kill(grandchild, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_children_reaped_in_the_block_count() -> None:
    with measured() as m:
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert m.cpu_s >= 0.05
