"""A local SparkSession for the pipelines, and job progress on the terminal."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"


def local_session(app_name: str = "bucketq", master: str = "local[*]", **conf: str) -> SparkSession:
    """A local SparkSession (or the active one) with quick JVM start-up and ``bucketq`` registered.

    Python workers run this interpreter, so they import the same bucketq.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from bucketq.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", FAST_JVM)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@contextmanager
def progress(spark: SparkSession, description: str, *, enabled: bool = True) -> Iterator[None]:
    """Show the tasks of the Spark jobs run inside the block as a progress bar on stderr."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    sc = spark.sparkContext
    group = f"bucketq-{id(description)}-{threading.get_ident()}"
    sc.setJobGroup(group, description)
    stop = threading.Event()
    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
        TimeElapsedColumn(), console=Console(stderr=True), transient=False,
    )
    task = bar.add_task(description, total=None)

    def poll() -> None:
        tracker = sc.statusTracker()
        while not stop.wait(0.5):
            try:
                total = done = 0
                for job in tracker.getJobIdsForGroup(group):
                    info = tracker.getJobInfo(job)
                    for stage in info.stageIds if info else []:
                        s = tracker.getStageInfo(stage)
                        if s is not None:
                            total += s.numTasks
                            done += s.numCompletedTasks
                if total:
                    bar.update(task, total=total, completed=done)
            except Exception:  # the JVM may be shutting down
                return

    thread = threading.Thread(target=poll, daemon=True)
    with bar:
        thread.start()
        try:
            yield
            bar.update(task, completed=bar.tasks[0].total or 0)
        finally:
            stop.set()
            thread.join(timeout=2)
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
