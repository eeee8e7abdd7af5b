"""``quick_topic_deletion``: ``delete_topic`` without its seven-second fence wait.

A deletion marks the topic ``deleting``, then waits ``TOPIC_DELETE_WAIT_S`` (7 s, longer than a
writer's ``TOPIC_FENCE_S``) so every publish acknowledged before the mark has landed, then purges.
Tests whose subject is what a deletion does or prints, with no writer running across it, use this
fixture: every step still runs, in order, and only the wait shrinks to ``QUICK_WAIT_S``. The wait
itself is tested where a writer does run across a deletion, on the real default
(``tests/sidecar/test_sidecar_errors.py::test_topic_deleted_while_publishing_is_never_acknowledged``)
and on explicit waits (``tests/engine/test_topic_incarnation.py``, the simulation's topic churn).
The engine's default is untouched: only this process's ``TopicCatalog.delete`` default changes, for
one test (``monkeypatch`` restores it).
"""

from __future__ import annotations

import pytest

from bucketq.core.topics import TopicCatalog

QUICK_WAIT_S = 0.05


@pytest.fixture
def quick_topic_deletion(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = TopicCatalog.delete.__kwdefaults__
    assert defaults is not None and "fence_wait_s" in defaults, "TopicCatalog.delete lost its fence_wait_s"
    monkeypatch.setitem(defaults, "fence_wait_s", QUICK_WAIT_S)
