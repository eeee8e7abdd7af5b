"""Property-based fuzzing of the whole localhost API, generated from openapi/sidecar.yaml.

A real sidecar process on the file backend gets schemathesis-generated requests (valid and
invalid) for every operation: none may answer 5xx, and every answer must be one the spec
documents, with a body that matches its schema.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, create_topics

pytestmark = [pytest.mark.e2e]

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "sidecar.yaml"
EXAMPLES_PER_OPERATION = 30  # about 15 operations: well under a minute in all
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_generated_requests_never_get_5xx_and_match_the_spec(
    tmp_path: Path, sidecars: SidecarFactory
) -> None:
    engine = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    asyncio.run(create_topics(engine, "fuzz"))
    sc = sidecars(
        engine,
        "fuzz",
        BUCKETQ_FILE_PATH=str(engine.file_path),
        consumer="c",
        topics="fuzz",
        max_wait_s=0.2,  # generated long polls end at once
        max_body_bytes=65536,
    )
    schema = schemathesis.openapi.from_path(SPEC)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 13  # every path of the spec

    for operation in operations:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(base_url=sc.url, checks=CHECKS, timeout=10)

        check()
    assert sc.process.poll() is None, sc.log()
