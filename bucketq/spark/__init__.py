"""bucketq for Spark: the ``bucketq`` PySpark data source and the bulk pipelines built on it.

::

    import bucketq.spark
    bucketq.spark.register(spark)
    df = spark.read.format("bucketq").option("topic", "orders").load()

Needs the ``spark`` extra (``pip install 'bucketq[spark]'``: pyspark >= 4, pyarrow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bucketq._extras import require

# pyspark is imported only where it is used (``bucketq spark --help`` stays fast), but every module
# of this package needs it: say so at the door, with the install hint.
require("bucketq.spark", "spark")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

__all__ = ["PUSHDOWN_CONF", "activate", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``bucketq`` format with ``spark`` and make it the calling thread's active
    session (see :func:`activate`). Call it again in each driver thread that reads or writes.

    The session's filter pushdown setting (:data:`PUSHDOWN_CONF`) is left as it is: the source
    takes no filters from Spark either way, so every query's answer is the same as without it.
    """
    from bucketq.spark.source import BucketqDataSource

    spark.dataSource.register(BucketqDataSource)
    activate(spark)


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling thread.

    Spark looks a Python data source up through the *thread's* active session
    (``SparkSession.getActiveSession`` in the JVM), which a new driver thread does not have: there
    ``df.write.format("bucketq").save()`` fails with ``DATA_SOURCE_NOT_FOUND`` although the session
    has the source. The pipelines call this before every read and write; code of its own that
    uses the source from several threads calls :func:`register` (or this) in each.
    """
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the server resolves sources per session, not per thread
        return
    session_class = getattr(type(spark), "_get_j_spark_session_class", None)
    java = session_class(jvm) if session_class is not None else jvm.org.apache.spark.sql.SparkSession
    java.setActiveSession(spark._jsparkSession)
