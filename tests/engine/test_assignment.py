"""Which member polls which partition: the balanced assignment, and how a group agrees on it."""

from __future__ import annotations

import asyncio
import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bucketq.core.keys import Keys
from bucketq.core.membership import Membership, balanced_owners, owned_partitions, rendezvous_owner
from bucketq.storage import MemoryStore, Storage

member_ids = st.lists(
    st.text("abcdef0123456789-", min_size=4, max_size=20), min_size=1, max_size=12, unique=True
)


@settings(max_examples=300, deadline=None)
@given(members=member_ids, partitions=st.integers(1, 64))
def test_every_partition_has_one_owner_and_loads_differ_by_at_most_one(
    members: list[str], partitions: int
) -> None:
    owned = {m: owned_partitions(m, members, partitions, balanced=True) for m in members}
    every = sorted(p for parts in owned.values() for p in parts)
    assert every == list(range(partitions)), "each partition owned exactly once"
    loads = [len(parts) for parts in owned.values()]
    assert max(loads) - min(loads) <= 1, owned
    # every member computes the same answer from the same list, in any order
    assert balanced_owners(tuple(sorted(members)), partitions) == balanced_owners(
        tuple(sorted(reversed(members))), partitions
    )


def test_a_member_joining_moves_few_partitions() -> None:
    """Scores decide, so a join moves about the joiner's share, not the whole table: over 500
    seeded groups, 1.3 times the share on average (plain rendezvous: exactly the share); the load
    bounds cascade a little where a member's bound drops."""
    rng = random.Random(7)
    moved_total = share_total = 0.0
    for _ in range(500):
        members = sorted({f"{rng.getrandbits(40):010x}" for _ in range(rng.randint(1, 12))})
        partitions = rng.randint(1, 64)
        before = balanced_owners(tuple(members), partitions)
        after = balanced_owners(tuple(sorted([*members, "joiner"])), partitions)
        moved = sum(1 for b, a in zip(before, after, strict=True) if b != a)
        assert moved <= partitions // 2 + -(-partitions // (len(members) + 1)), (members, partitions)
        moved_total += moved
        share_total += partitions / (len(members) + 1)
    assert moved_total <= 1.5 * share_total, moved_total / share_total


def test_as_many_partitions_as_members_gives_each_member_one() -> None:
    members = [f"m{i}" for i in range(4)]
    rendezvous = {rendezvous_owner(p, members) for p in range(4)}
    assert len(rendezvous) < 4, "plain rendezvous leaves one of these members without a partition"
    assert sorted(balanced_owners(tuple(members), 4)) == members


async def test_a_group_balances_only_once_every_live_member_announces_it() -> None:
    """A heartbeat without ``"assign"`` (an older release, during a rolling upgrade) keeps the
    whole group on plain rendezvous, so members of both releases agree on the owners."""
    storage = Storage(MemoryStore())
    keys = Keys()
    new = Membership(storage, keys, "t", "g", "new", ttl_s=30)
    newer = Membership(storage, keys, "t", "g", "newer", ttl_s=30)
    await new.heartbeat()
    await newer.heartbeat()
    await new.refresh()
    assert new.balanced and new.members == ["new", "newer"]
    old_body = {"member": "old", "host": "h", "pid": 1, "help": []}  # what the older release writes
    await storage.overwrite(keys.member("t", "g", "old"), json.dumps(old_body).encode())
    await new.refresh()
    assert not new.balanced and new.members == ["new", "newer", "old"]
    await storage.delete([keys.member("t", "g", "old")])  # the old member left
    await new.refresh()
    assert new.balanced and new.members == ["new", "newer"]


async def test_a_peer_whose_heartbeat_aged_out_for_a_moment_still_counts_as_balanced() -> None:
    """A peer's heartbeat is cached by ETag. One that aged out for a moment (a pause) and came back
    with the same body, so the same ETag, must still count as announcing the balanced assignment:
    forgetting it made this member fall back to plain rendezvous while its peers stayed balanced,
    and a partition ended up owned by nobody (the simulation's quiesced group never claimed it)."""
    storage, keys = Storage(MemoryStore()), Keys()
    me = Membership(storage, keys, "t", "g", "me", ttl_s=0.2)
    peer = Membership(storage, keys, "t", "g", "peer", ttl_s=0.2)
    await peer.heartbeat()
    assert await me.refresh() == ["me", "peer"] and me.balanced
    await asyncio.sleep(0.3)  # the peer is paused past its TTL
    assert await me.refresh() == ["me"]
    await peer.heartbeat()  # it resumes: same body, same ETag
    assert await me.refresh() == ["me", "peer"]
    assert me.balanced, "the peer's cached announcement was forgotten"
    assert me.owned(2) == owned_partitions("me", ["me", "peer"], 2, balanced=True)
