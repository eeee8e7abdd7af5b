"""Shared fixtures and Hypothesis profiles. S3 servers and opened storages live in ``servers.py``.

Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (default ``ci``):

* ``ci`` — derandomised: every run (CI, ``make test``) tries the same examples, so
  a rule broken at one exact boundary is caught every time or never, not one run in four; no
  example database, so a run cannot depend on what an earlier run happened to find.
* ``soak`` — random and many times larger, for hunting new counterexamples; failures are saved
  in ``.hypothesis/`` and replayed first next time.
* ``mutate`` — ``ci`` with half the examples and no shrinking, for ``make mutate``.
"""

import os
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from servers import file_storage, memory_storage, moto_server, s3_backend, seaweedfs_server

__all__ = ["file_storage", "memory_storage", "moto_server", "s3_backend", "seaweedfs_server"]

# deadline=None everywhere: a shared 2-core machine makes single examples slow at random, and a
# property test about protocol rules must not fail on timing
settings.register_profile(
    "ci", derandomize=True, database=None, max_examples=60, stateful_step_count=30, deadline=None,
    print_blob=True,
)
settings.register_profile("soak", max_examples=2000, stateful_step_count=60, deadline=None, print_blob=True)
# `make mutate`: derandomised like `ci`, half the examples and no shrinking. Every surviving mutant
# of the cursor rules runs this test, and a killed one only needs to fail: shrinking its
# counterexample costs minutes per mutant and tells nobody anything.
settings.register_profile(
    "mutate", settings.get_profile("ci"), max_examples=30, phases=[Phase.explicit, Phase.generate]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# `make test` runs the suite on several workers (pytest-xdist, ``--dist loadgroup``). Areas that
# share one expensive thing per process stay on one worker: the Spark tests share a SparkSession,
# the operator tests one emulated API server and operator, and the chaos tests and the simulation
# batch use every core on their own. Everything else is spread test by test.
_GROUPS = {"spark": "spark", "operator": "operator", "chaos": "cpu-bound", "sim": "cpu-bound"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        path = Path(str(item.path))
        area = path.relative_to(tests).parts[0] if tests in path.parents else ""
        if area in _GROUPS:
            item.add_marker(pytest.mark.xdist_group(_GROUPS[area]))
