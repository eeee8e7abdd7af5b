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

__all__ = ["PUSHDOWN_CONF", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``bucketq`` format with ``spark`` (once per session).

    The session's filter pushdown setting (:data:`PUSHDOWN_CONF`) is left as it is: the source
    takes no filters from Spark either way, so every query's answer is the same as without it.
    """
    from bucketq.spark.source import BucketqDataSource

    spark.dataSource.register(BucketqDataSource)
