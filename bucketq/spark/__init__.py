"""bucketq for Spark: the ``bucketq`` PySpark data source and the bulk pipelines built on it.

::

    import bucketq.spark
    bucketq.spark.register(spark)
    df = spark.read.format("bucketq").option("topic", "orders").load()

Needs the ``spark`` extra (``pip install 'bucketq[spark]'``: pyspark >= 4, pyarrow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

__all__ = ["PUSHDOWN_CONF", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``bucketq`` format with ``spark``.

    Where the session allows SQL filter pushdown into Python data sources (Spark >= 4.1), it is
    switched on unless the session explicitly set it to false, and partition, seq and created_at
    predicates of ``where`` clauses then narrow what is read.
    """
    from bucketq.spark.source import BucketqDataSource, PushdownDataSource

    source: type[BucketqDataSource] = BucketqDataSource
    try:
        current = spark.conf.get(PUSHDOWN_CONF, None)
    except Exception:  # the conf does not exist in this Spark version
        current = "false"
    if current is None or current.lower() == "true":
        try:
            spark.conf.set(PUSHDOWN_CONF, "true")
            source = PushdownDataSource
        except Exception:
            source = BucketqDataSource
    spark.dataSource.register(source)
