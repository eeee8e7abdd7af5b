"""A local SparkSession for the pipelines, and job progress on the terminal."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"


def _log_config(level: str) -> str:
    """A log4j2 configuration file logging ``level`` and above to stderr (Spark's own logs)."""
    path = os.path.join(tempfile.gettempdir(), f"bucketq-spark-log4j2-{level}.properties")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(
                f"rootLogger.level = {level}\nrootLogger.appenderRef.stderr.ref = console\n"
                "appender.console.type = Console\nappender.console.name = console\n"
                "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
                "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex\n"
            )
    return path


def local_session(
    app_name: str = "bucketq", master: str = "local[*]", *, log_level: str = "error", **conf: str
) -> SparkSession:
    """A local SparkSession (or the active one) with quick JVM start-up and ``bucketq`` registered.

    Python workers run this interpreter, so they import the same bucketq. Spark logs only at
    ``log_level`` (``off`` for the CLI, whose errors are reported as one line).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from bucketq.spark import register

    jvm = f"{FAST_JVM} -Dlog4j2.configurationFile={_log_config(log_level.lower())}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", jvm)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level.upper())
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
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
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
