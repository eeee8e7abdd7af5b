"""Objects bucketq did not write, dropped into its data prefixes (invariant I8, core/foreign.py).

A bucket is shared with people and tools: a ``.keep``, a ``README.txt``, a console's folder marker.
Every listing of a data prefix skips such a name wherever it sorts (``.keep`` before the numbers,
``README.txt`` after them), logs it once and counts it; GC never deletes it. Before, one such name
under ``p{P}/seg/`` raised ``ValueError`` in ``parse_seq``: GC died on every run, a new
``earliest`` subscription could not join and a producer without a head hint could not publish
(reproduction r11).
"""

from __future__ import annotations

import pytest

from bucketq.core import foreign
from bucketq.core.keys import Keys, heartbeat_member, is_topic_object, seq_of
from bucketq.core.membership import Membership
from bucketq.core.txn import TxnPartition, TxnRecord, create_txn, list_txns, take_snapshot
from tests.support.engine_helpers import Backend, drain, poll_one

FOREIGN_NAMES = [".keep", "README.txt", "0000000000000001.jsonl.bak", "notes/", "7.json"]


def test_only_names_bucketq_writes_parse() -> None:
    keys = Keys("r")
    assert seq_of(keys.segment("t", 0, 42), "jsonl") == 42
    assert seq_of(keys.delta("t", "c", 0, 7), "json") == 7
    assert seq_of(keys.checkpoint("t", "c", 3, 64), "json") == 64
    for name in FOREIGN_NAMES:
        assert seq_of(keys.segments_prefix("t", 0) + name, "jsonl") is None
        assert seq_of(keys.deltas_prefix("t", "c", 0) + name, "json") is None
    assert seq_of(keys.segment("t", 0, 1), "json") is None, "a segment name is not a delta name"
    prefix = keys.members_prefix("t", "c")
    assert heartbeat_member(keys.member("t", "c", "m-1"), prefix) == "m-1"
    assert heartbeat_member(prefix + "README.txt", prefix) is None
    assert heartbeat_member(prefix + "sub/m.json", prefix) is None
    assert is_topic_object(keys.delta("t", "c", 0, 1), keys.topic_prefix("t"))
    assert not is_topic_object(keys.topic_prefix("t") + "p0000/seg/README.txt", keys.topic_prefix("t"))


@pytest.mark.parametrize("name", [".keep", "README.txt"])
async def test_a_foreign_segment_name_stops_nothing(backend: Backend, name: str) -> None:
    """r11: GC, a producer without a head hint and a new ``earliest`` subscription all work past a
    foreign object in ``seg/`` (``.keep`` sorts before the segments, ``README.txt`` after)."""
    bq = await backend.connect()
    await bq.create_topic("t")
    await bq.publish("t", "before")
    keys = bq.keys
    junk = keys.segments_prefix("t", 0) + name
    await bq.storage.overwrite(junk, b"not a segment\n")
    before = foreign.foreign_sightings()

    report = await bq.collect_garbage(["t"])
    assert report.foreign_objects == 1 and junk in report.foreign_keys

    await bq.storage.delete([keys.head("t", 0)])  # a fresh producer must find the tail by listing
    fresh = await backend.connect()
    result = await (await fresh.register_producer("fresh")).publish("t", "after")
    assert result.seq == 1, "the tail is the last segment, not the foreign name sorted after it"

    consumer = await bq.register_consumer("new", "t", start_position="earliest")
    got = await drain(consumer, 2)
    assert len(got) == 2, "an earliest start is the oldest segment, not the foreign name before it"
    assert foreign.foreign_sightings() > before
    assert await bq.storage.get(junk) is not None, "nobody deletes what it did not write"


async def test_foreign_objects_in_every_data_prefix_are_skipped_and_kept(backend: Backend) -> None:
    bq = await backend.connect(consumer={"checkpoint_every": 2})
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    for i in range(4):
        await p.publish("t", i, dedup_id=f"d{i}")
    member = await bq.register_consumer("c", "t")
    await drain(member, 4)
    keys = bq.keys
    junk = [
        keys.segments_prefix("t", 0) + ".keep",
        keys.deltas_prefix("t", "c", 0) + "README.txt",
        keys.checkpoints_prefix("t", "c", 0) + "zz-sync.lock",
        keys.dedup_prefix("t") + "README",
        keys.txn_prefix("t") + ".keep",
        keys.members_prefix("t", "c") + "notes.txt",
        keys.members_topic_prefix("t") + "README.md",
        keys.subs_prefix("t") + "Archive/old.txt",  # a folder no consumer name can have
        keys.subs_prefix("t") + "stray/file.txt",  # a valid name, but no cursor object under it
        keys.probes_prefix() + "README",
        keys.topics_prefix() + "Team Folder/report.csv",  # a folder at the root no topic can have
    ]
    for key in junk:
        await bq.storage.overwrite(key, b"someone else's\n")
    # a heartbeat-shaped name with an unreadable body (a killed writer's empty object)
    await bq.storage.overwrite(keys.member("t", "c", "killed"), b"")

    # GC runs to its end, frees nothing it does not own, and counts each foreign object it lists
    report = await bq.collect_garbage(["t"])
    full = await bq.collect_garbage()  # every topic and the bucket-wide leftovers
    listed = {  # a folder shows as its prefix in a delimiter listing
        junk[0],
        junk[3],
        junk[5],
        junk[6],
        keys.subs_prefix("t") + "Archive/",
        junk[8],
        junk[9],
        keys.topics_prefix() + "Team Folder/",
    }
    assert listed <= set(full.foreign_keys) and full.foreign_objects == len(full.foreign_keys)
    assert {junk[0], junk[5], junk[8]} <= set(report.foreign_keys)
    for key in junk:
        assert await bq.storage.get(key) is not None, f"GC deleted {key}, which it did not write"
    assert not any(k in junk for k in report.deleted_keys + full.deleted_keys)

    # a cursor reload passes over the foreign checkpoint name; membership ignores the stray
    # objects (one used to make every refresh fail, so no member saw the others)
    await member.close()
    again = await bq.register_consumer("c", "t")
    await p.publish("t", "more")
    assert (await poll_one(again)).payload == "more"
    view = Membership(bq.storage, keys, "t", "c", "probe", 20.0)
    assert again.member in await view.refresh()


async def test_foreign_names_among_job_commits_are_skipped_and_kept(backend: Backend) -> None:
    """A foreign ``x.json`` under ``txn/`` is no record: readers' snapshots, GC's pass over the
    job commits and a job's own listing skip it (before, it was read as a record and every one of
    them raised). A foreign name under ``chunk/`` is never collected, however old."""
    store = backend.time_travel()
    bq = await backend.connect()
    await bq.create_topic("t")
    keys = bq.keys
    record = TxnRecord("job-1.000001", "t", job="job-1", owner="run", partitions={0: TxnPartition(0)})
    await create_txn(bq.storage, keys, record)
    junk = [
        keys.txn_prefix("t") + "x.json",
        keys.txn_prefix("t") + "job-1.json",  # a job's prefix, no commit number
        keys.chunks_prefix("t") + "README.txt",
        keys.chunks_prefix("t") + "job-1/run/notes.txt",
    ]
    for key in junk:
        await bq.storage.overwrite(key, b"someone else's\n")

    assert await list_txns(bq.storage, keys, "t") == [record.id]
    assert await list_txns(bq.storage, keys, "t", "job-1") == [record.id]
    snapshot = await take_snapshot(bq.storage, keys, "t")
    assert list(snapshot.records) == [record.id]

    store.advance(3 * 86_400)  # older than any leftover chunk's time to live, on the store's clock
    report = await bq.collect_garbage(["t"])
    assert set(junk) <= set(report.foreign_keys)
    for key in junk:
        assert await bq.storage.get(key) is not None, f"GC deleted {key}, which it did not write"
