"""Entry point Spark scans for on start-up: makes ``spark.read.format("bucketq")`` work without
``bucketq.spark.register(spark)`` (Spark loads ``DefaultSource`` from top-level ``pyspark_*`` modules)."""

from bucketq.spark.source import BucketqDataSource as DefaultSource

__all__ = ["DefaultSource"]
