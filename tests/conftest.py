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

from hypothesis import Phase, settings

from tests.support.servers import file_storage, memory_storage, moto_server, s3_backend, seaweedfs_server

__all__ = ["file_storage", "memory_storage", "moto_server", "s3_backend", "seaweedfs_server"]

# deadline=None everywhere: a shared 2-core machine makes single examples slow at random, and a
# property test about protocol rules must not fail on timing
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
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
