"""Shared fixtures, Hypothesis profiles, marker checks and the opt-out summary.

S3 servers and opened storages live in ``tests/support/servers.py``; the tools the tests need beyond
``.venv`` (and ``BUCKETQ_TEST_SKIP``, the one opt-out) in ``tests/support/tools.py``.

Markers (pyproject): ``s3`` (starts an S3 server), ``spark``, ``e2e`` (real processes), ``slow``.
``make test-fast`` deselects all four, so they must be accurate: a test that uses the moto or
SeaweedFS server fixture gets the ``s3`` mark here even if its module forgot it (tests that reach a
server through ``request.getfixturevalue`` must carry the mark themselves).

Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (default ``ci``):

* ``ci`` — derandomised: every run (CI, ``make test``) tries the same examples, so
  a rule broken at one exact boundary is caught every time or never, not one run in four; no
  example database, so a run cannot depend on what an earlier run happened to find.
* ``soak`` — random and many times larger, for hunting new counterexamples; failures are saved
  in ``.hypothesis/`` and replayed first next time.
* ``mutate`` — ``ci`` with half the examples and no shrinking, for ``make mutate``.
"""

import os
from collections import Counter

import pytest
from hypothesis import Phase, settings

from tests.support import tools
from tests.support.servers import file_storage, memory_storage, moto_server, s3_backend, seaweedfs_server
from tests.support.topic_deletion import quick_topic_deletion

__all__ = [
    "file_storage",
    "memory_storage",
    "moto_server",
    "quick_topic_deletion",
    "s3_backend",
    "seaweedfs_server",
]

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


S3_SERVER_FIXTURES = {"moto_server", "seaweedfs_server"}


def pytest_configure(config: pytest.Config) -> None:
    tools.opted_out()  # an unknown area in BUCKETQ_TEST_SKIP is a usage error, before anything runs


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses the moto or SeaweedFS server fixture starts an S3 server: it is an ``s3``
    test even where its module forgot the mark (``make test-fast`` must never start one).

    On xdist workers, the tests marked ``slow`` come first (otherwise in collection order; tests of
    a built-once fixture apart, see :func:`schedule_ranks`): xdist's
    ``load`` scheduling deals tests in this order, so a minute-long test never starts near the end
    and finishes alone on one worker while the other idles. Every worker sorts the same way, as
    xdist requires. This needs ``--maxschedchunk=1`` (``make test``): with xdist's default first
    chunks (a quarter of each worker's share, consecutive), all the slow tests go to one worker."""
    for item in items:
        if (
            S3_SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
            and item.get_closest_marker("s3") is None
        ):
            item.add_marker(pytest.mark.s3)
    if hasattr(config, "workerinput"):
        ranks = schedule_ranks(items)
        items.sort(key=lambda item: ranks[item.nodeid])  # stable: collection order within a rank


# Fixtures built once per run behind a lock (tests/support/built_once.py): dealt side by side, their
# tests started together on every worker, one building while the others waited on the lock (~35 s).
BUILT_ONCE_FIXTURES = {"image_venv"}


def schedule_ranks(items: list[pytest.Item]) -> dict[str, int]:
    """0: slow tests, and the first test of each built-once fixture (it starts the build early);
    1: the other tests of those fixtures, dealt after every slow test, when the build is done;
    2: the rest."""
    ranks: dict[str, int] = {}
    started: set[str] = set()
    for item in items:
        built = BUILT_ONCE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if built:
            ranks[item.nodeid] = 1 if built <= started else 0
            started |= built
        else:
            ranks[item.nodeid] = 0 if item.get_closest_marker("slow") is not None else 2
    return ranks


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which areas ``BUCKETQ_TEST_SKIP`` opted out of, and how many tests each one skipped."""
    areas = tools.opted_out()
    if not areas:
        return
    skipped: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) else ""
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(tools.SKIP_PREFIX):
            skipped[reason.removeprefix(tools.SKIP_PREFIX).split(":", 1)[0]] += 1
    terminalreporter.section(f"opted out with {tools.SKIP_ENV} (these areas did NOT run)", yellow=True)
    for area in sorted(areas):
        count = skipped[area]
        what = f"{count} test(s) skipped" if count else "nothing skipped (its tools are installed)"
        terminalreporter.write_line(f"{area}: {what} — {tools.AREAS[area]}")
