"""Fixtures of the Spark tests: one local[2] SparkSession for the whole run, buckets on moto server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketq.config import Settings
from bucketq.spark.options import settings_options
from tests.support.servers import S3Server
from tests.support.tools import MissingToolModule, spark_missing

# Without pyspark, pyarrow or Java the test modules cannot be imported: each one is collected as a
# single item that fails naming what is missing (skipped with BUCKETQ_TEST_SKIP=spark), never
# silently left out of the run.
SPARK_MISSING = spark_missing()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.File | None:
    if SPARK_MISSING is None:
        return None
    node = MissingToolModule.from_parent(parent, path=module_path)
    node.area, (node.what, node.install) = "spark", SPARK_MISSING
    node.add_marker(pytest.mark.spark)
    return node


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared SparkSession (local[2], fast JVM start, bucketq registered)."""
    from bucketq.spark.session import local_session

    session = local_session("bucketq-tests", master="local[2]")
    _sessions.append(session)
    yield session
    session.stop()


# Stopped after the last Spark test rather than at the end of the session: an idle JVM still
# takes memory and CPU from every later test.
_sessions: list[Any] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    here = Path(__file__).parent
    if nextitem is None or here not in Path(str(nextitem.path)).parents:
        while _sessions:
            _sessions.pop().stop()


@pytest.fixture
def bucket(moto_server: S3Server) -> Settings:
    """Settings of a fresh bucket on the moto server."""
    return moto_server.settings(strategy="conditional_write")


@pytest.fixture
def options(bucket: Settings) -> dict[str, str]:
    """Data source options reaching the fresh bucket."""
    return settings_options(bucket)
