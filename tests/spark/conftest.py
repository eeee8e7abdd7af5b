"""Fixtures of the Spark tests: one local[2] SparkSession for the whole run, buckets on moto server."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra (pip install 'bucketq[spark]')")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("needs a Java runtime for Spark", allow_module_level=True)

from servers import S3Server  # noqa: E402

from bucketq.config import Settings  # noqa: E402
from bucketq.spark.options import settings_options  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared SparkSession (local[2], fast JVM start, bucketq registered)."""
    from bucketq.spark.session import local_session

    session = local_session("bucketq-tests", master="local[2]")
    yield session
    session.stop()


@pytest.fixture
def bucket(moto_server: S3Server) -> Settings:
    """Settings of a fresh bucket on the moto server."""
    return moto_server.settings(strategy="conditional_write")


@pytest.fixture
def options(bucket: Settings) -> dict[str, str]:
    """Data source options reaching the fresh bucket."""
    return settings_options(bucket)
