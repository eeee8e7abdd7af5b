"""The checker must be able to fail: each invariant is shown a hand-made violating history (and a
close legal one). A checker that cannot fail proves nothing."""

from __future__ import annotations

from typing import Any

from .checker import check
from .history import Event, from_jsonl, to_jsonl

EPOCH = 1_800_000_000.0


class H:
    """A tiny history builder: events get increasing indexes; ``at`` sets the time."""

    def __init__(self, **params: Any) -> None:
        self.events: list[Event] = []
        self.t = 0.0
        self.cid = 0
        self.add("run", seed=0, family="hand", epoch=EPOCH, params=params)

    def at(self, t: float) -> H:
        self.t = t
        return self

    def add(self, ev: str, **fields: Any) -> Event:
        e: Event = {"i": len(self.events), "t": self.t, "ev": ev, **fields}
        self.events.append(e)
        return e

    def call(self, op: str, proc: str = "p#1", **fields: Any) -> int:
        self.cid += 1
        self.add("call", cid=self.cid, proc=proc, op=op, **fields)
        return self.cid

    def ret(self, cid: int, outcome: str = "ok", **fields: Any) -> None:
        self.add("ret", cid=cid, outcome=outcome, **fields)

    def topic(self, name: str = "t") -> H:
        self.ret(self.call("create_topic", "admin", topic=name))
        return self

    def join(self, group: str = "g", topic: str = "t", member: str = "m1", ordered: bool = False) -> H:
        self.ret(
            self.call(
                "join",
                f"member.{member}#1",
                group=group,
                topic=topic,
                start_position="earliest",
                ordered=ordered,
            ),
            member=member,
        )
        return self

    def publish(
        self,
        tag: str,
        seq: int,
        *,
        topic: str = "t",
        key: str | None = None,
        dedup: str | None = None,
        duplicate: bool = False,
        idx: int = 0,
    ) -> H:
        cid = self.call("publish", "prod#1", topic=topic, tag=tag, key=key, dedup_id=dedup, delay=None)
        self.ret(cid, partition=0, seq=seq, index=idx, offset=seq, id=tag, duplicate=duplicate)
        return self

    def deliver(
        self,
        tag: str,
        seq: int,
        *,
        member: str = "m1",
        group: str = "g",
        lease_s: float = 30.0,
        skew: float = 0.0,
        key: str | None = None,
        receipt: str | None = None,
        topic: str = "t",
        idx: int = 0,
        msg_id: str | None = None,
    ) -> str:
        receipt = receipt or f"{topic}:0:{seq}:{idx}:{member}-{self.t}"
        self.add(
            "deliver",
            proc=f"member.{member}#1",
            member=member,
            group=group,
            topic=topic,
            partition=0,
            seq=seq,
            idx=idx,
            tag=tag,
            id=msg_id or f"id-{tag}-{seq}",
            key=key,
            receipt=receipt,
            until=EPOCH + self.t + skew + lease_s,
            skew=skew,
            deliveries=1,
        )
        return receipt

    def job(self, name: str, tags: list[str], outcome: str = "ok", *, topic: str = "t", run: str = "r1") -> H:
        """One run of a write job (the ``job`` app call)."""
        cid = self.call("job", f"job.{name}#1", job=name, topic=topic, run=run, tags=tags)
        self.ret(
            cid,
            outcome,
            **(
                {"txn": f"{name}.000001", "recovered": False, "messages": len(tags)}
                if outcome == "ok"
                else {"error": "TxnError"}
            ),
        )
        return self

    def txn(self, name: str, state: str, seqs: list[int | None], *, n: int = 1, topic: str = "t") -> H:
        """The store's journal: the job's record ``{name}.{n}`` written with partition 0's chunk seqs."""
        self.add(
            "txn",
            topic=topic,
            id=f"{name}.{n:06d}",
            job=name,
            owner="r1",
            state=state,
            reason=None,
            partitions={"0": seqs},
        )
        return self

    def settle(
        self,
        op: str,
        receipt: str,
        tag: str,
        seq: int,
        outcome: str = "ok",
        error: str | None = None,
        member: str = "m1",
        **fields: Any,
    ) -> None:
        cid = self.call(
            op,
            f"member.{member}#1",
            group="g",
            topic="t",
            partition=0,
            seq=seq,
            idx=0,
            tag=tag,
            receipt=receipt,
            **fields,
        )
        self.ret(cid, outcome, **({"error": error} if error else {}))


def names(h: H) -> list[str]:
    return [v.invariant for v in check(h.events)]


# -- acked_publish_delivered -----------------------------------------------------------------------


def test_lost_acknowledged_publish_is_a_violation() -> None:
    h = H().topic().join().at(5).publish("a", 0).at(6).publish("b", 1)
    h.at(7).deliver("a", 0)
    assert names(h) == ["acked_publish_delivered"]
    h.at(8).deliver("b", 1)
    assert names(h) == []


def test_publish_before_the_subscription_or_into_a_later_deleted_topic_is_not_required() -> None:
    h = H().topic().at(1).publish("early", 0).at(2).join()
    assert names(h) == []
    h = H().topic().join().at(2).publish("doomed", 0)
    h.at(3).ret(h.call("delete_topic", "op", topic="t"))
    assert "acked_publish_delivered" not in names(h)


def test_dead_letter_copies_are_stored_once_per_group() -> None:
    """Two groups that give up on one message each leave a copy carrying its dedup id (found by
    seed 243); one group's second copy is a violation."""
    h = H().topic().join().at(1).publish("a", 0, dedup="d")
    for seq, group in enumerate(["g0", "g1"]):
        h.at(9).add(
            "stored",
            topic="t.dlq",
            partition=0,
            seq=seq,
            tags=["a"],
            dedups=["d"],
            keys=[None],
            dlq_for=[group],
        )
    assert "dedup_stored_once" not in names(h)
    h.at(9).add(
        "stored", topic="t.dlq", partition=0, seq=2, tags=["a"], dedups=["d"], keys=[None], dlq_for=["g1"]
    )
    assert "dedup_stored_once" in names(h)


def test_a_dead_letter_copy_for_the_group_settles_the_message() -> None:
    h = H().topic().join().at(2).publish("a", 0)
    h.at(9).add(
        "stored", topic="t.dlq", partition=0, seq=0, tags=["a"], dedups=["x"], keys=[None], dlq_for=["g"]
    )
    assert names(h) == []


# -- exclusive_lease -------------------------------------------------------------------------------


def test_second_delivery_under_a_live_lease_is_a_violation() -> None:
    h = H().topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30)
    h.at(20).deliver("a", 0, member="m2")
    assert names(h) == ["exclusive_lease"]


def test_delivery_after_expiry_or_settlement_is_legal() -> None:
    h = H().topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30)
    h.at(33).deliver("a", 0, member="m2")  # expired at 32
    assert names(h) == []
    h = H().topic().join().join(member="m2").at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, member="m1", lease_s=30)
    h.at(5).settle("nack", r, "a", 0, requeue=True, delay=0.0)
    h.at(6).deliver("a", 0, member="m2")
    assert names(h) == []


def test_lease_deadline_is_read_in_the_holders_clock() -> None:
    # m1's clock runs 1.5 s ahead: its lease "until now+30" ends at true time 32, not 33.5
    h = H().topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30, skew=1.5)
    h.at(32.5).deliver("a", 0, member="m2")
    assert names(h) == []
    h = H().topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30, skew=1.5)
    h.at(31.5).deliver("a", 0, member="m2")
    assert names(h) == ["exclusive_lease"]


def test_an_extend_prolongs_the_lease_and_a_lost_lease_ack_does_not_settle() -> None:
    h = H().topic().join().join(member="m2").at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, member="m1", lease_s=10)
    h.ret(
        h.call(
            "extend",
            "member.m1#1",
            receipt=r,
            group="g",
            topic="t",
            partition=0,
            seq=0,
            idx=0,
            tag="a",
            seconds=30,
        ),
        until=EPOCH + 40,
    )
    h.at(20).settle("ack", r, "a", 0, outcome="error", error="LeaseLost")
    h.at(25).deliver("a", 0, member="m2")
    assert names(h) == ["exclusive_lease"]


# -- no_delivery_after_ack -------------------------------------------------------------------------


def test_delivery_after_an_ok_ack_is_a_violation() -> None:
    h = H().topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=5)
    h.at(3).settle("ack", r, "a", 0)
    h.at(100).deliver("a", 0, member="m2")
    assert names(h) == ["no_delivery_after_ack"]


def test_redelivery_after_a_lease_lost_ack_is_legal() -> None:
    h = H().topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=5)
    h.at(10).deliver("a", 0, member="m2")
    h.at(11).settle("ack", r, "a", 0, outcome="error", error="LeaseLost")
    assert names(h) == []


def _seek(h: H, target: str, *, group: str = "g") -> None:
    h.ret(h.call("seek", "operator.t#1", topic="t", group=group, target=target))


def test_a_seek_back_replays_what_was_in_flight_or_acked_before_it() -> None:
    h = H().topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=30)
    h.at(3)
    _seek(h, "earliest")
    h.at(4).settle("ack", r, "a", 0)  # the lease was kept across the seek; the seek replays it
    h.at(50).deliver("a", 0, member="m2")
    assert names(h) == []


def test_a_seek_back_does_not_excuse_a_redelivery_of_a_later_delivery() -> None:
    h = H().topic().join().at(1).publish("a", 0)
    h.at(2)
    _seek(h, "earliest")
    r = h.at(3).deliver("a", 0, lease_s=30)  # delivered after the seek landed
    h.at(4).settle("ack", r, "a", 0)
    h.at(50).deliver("a", 0, member="m2")
    assert names(h) == ["no_delivery_after_ack"]
    h2 = H().topic().join().at(1).publish("a", 0)
    r2 = h2.at(2).deliver("a", 0, lease_s=30)
    h2.at(3)
    _seek(h2, "latest")  # a seek forward never replays
    h2.at(4).settle("ack", r2, "a", 0)
    h2.at(50).deliver("a", 0, member="m2")
    assert names(h2) == ["no_delivery_after_ack"]


def test_a_seek_forward_excuses_only_what_was_published_before_it() -> None:
    h = H().topic().join().at(1).publish("a", 0)
    h.at(2)
    _seek(h, "latest")
    assert names(h) == []  # skipped by the seek
    h.at(3).publish("b", 1)
    assert names(h) == ["acked_publish_delivered"]  # published after it: must be delivered


# -- replicas_converge -----------------------------------------------------------------------------


def test_a_diverging_replica_is_a_violation() -> None:
    h = H()
    h.add("replica", topic="t", group="g", partition=0, member="m1", state={"n": 5, "floor": 1})
    h.add("fresh", topic="t", group="g", partition=0, state={"n": 5, "floor": 1})
    assert names(h) == []
    h.add("replica", topic="t", group="g", partition=0, member="m2", state={"n": 5, "floor": 2})
    assert names(h) == ["replicas_converge"]


# -- engine_alive ----------------------------------------------------------------------------------


def test_a_dead_loop_an_unexpected_exception_and_a_hung_call_are_violations() -> None:
    h = H(hang_limit_s=300.0)
    h.add(
        "loop_died", proc="member.m1#1", member="m1", error="ValueError", msg="delta 7 applied to state at 7"
    )
    assert names(h) == ["engine_alive"]
    h = H(hang_limit_s=300.0)
    h.ret(h.call("leave", member="m1"), "bug", error="KeyError", msg="x")
    assert names(h) == ["engine_alive"]
    h = H(hang_limit_s=300.0)
    h.call("leave", member="m1")
    h.at(400).add("phase", name="end")
    assert names(h) == ["engine_alive"]


def test_paused_or_crashed_time_does_not_count_as_a_hang() -> None:
    h = H(hang_limit_s=300.0)
    cid = h.call("leave", member="m1")
    h.add("pause", proc="p#1", until=1500.0)
    h.at(1600).ret(cid)
    assert names(h) == []
    h = H(hang_limit_s=300.0)
    h.call("leave", member="m1")
    h.at(10).add("crash", proc="p#1")
    h.at(1000).add("phase", name="end")
    assert names(h) == []


# -- per_key_order ---------------------------------------------------------------------------------


def test_a_later_message_of_a_key_before_an_earlier_one_is_settled_is_a_violation() -> None:
    h = H().topic().join(ordered=True).at(1).publish("k0", 0, key="K").publish("k1", 1, key="K")
    h.at(2).deliver("k1", 1, key="K")
    assert set(names(h)) == {"per_key_order", "acked_publish_delivered"}  # k0 was never delivered either
    h = H().topic().join(ordered=True).at(1).publish("k0", 0, key="K").publish("k1", 1, key="K")
    r = h.at(2).deliver("k0", 0, key="K")
    h.at(3).settle("ack", r, "k0", 0)
    h.at(4).deliver("k1", 1, key="K")
    assert names(h) == []


def test_unordered_groups_and_other_keys_are_not_constrained() -> None:
    h = H().topic().join().at(1).publish("k0", 0, key="K").publish("k1", 1, key="K")
    h.at(2).deliver("k1", 1, key="K")
    h.at(3).deliver("k0", 0, key="K", member="m2")
    assert names(h) == []
    h = H().topic().join(ordered=True).at(1).publish("k0", 0, key="K").publish("j1", 1, key="J")
    h.at(2).deliver("j1", 1, key="J")
    h.at(3).deliver("k0", 0, key="K")
    assert names(h) == []


# -- dedup_stored_once -----------------------------------------------------------------------------


def test_an_idempotent_publish_stored_twice_is_a_violation() -> None:
    h = H().topic().join().at(1).publish("a", 0, dedup="d").at(2).publish("a", 0, dedup="d", duplicate=True)
    h.at(3).deliver("a", 0)
    assert names(h) == []
    h.at(4).publish("a", 1, dedup="d")  # the retry wrote a second copy
    assert names(h) == ["dedup_stored_once"]
    h = H().topic().join().at(1).publish("a", 0, dedup="d")
    h.at(3).deliver("a", 0)
    h.at(9).add("stored", topic="t", partition=0, seq=4, tags=["a"], dedups=["d"], keys=[None])
    assert names(h) == ["dedup_stored_once"]


def test_an_orphan_below_the_floor_fence_is_stored_nowhere() -> None:
    """A put into a freed number that its writer then wrote again at the tail (I1): nobody reads
    the orphan and GC collects it; it is no second copy."""
    h = H().topic().join().at(1).publish("a", 5, dedup="d")
    h.at(3).deliver("a", 5)
    h.at(9).add("stored", topic="t", partition=0, seq=0, tags=["a"], dedups=["d"], keys=[None], orphan=True)
    assert names(h) == []


# -- no_publish_into_deleted_topic / no_phantom_delivery ------------------------------------------------


def test_a_publish_acknowledged_into_a_deleted_topic_is_a_violation() -> None:
    h = H().topic()
    h.at(2).ret(h.call("delete_topic", "op", topic="t"))
    h.at(3).publish("ghost", 7)
    assert names(h) == ["no_publish_into_deleted_topic"]
    h.at(5).ret(h.call("create_topic", "op", topic="t"))
    h.at(6).publish("fine", 0)
    assert names(h) == ["no_publish_into_deleted_topic"]


def test_a_delivery_of_something_never_published_is_a_violation() -> None:
    h = H().topic().join()
    h.at(2).deliver("nobody-sent-this", 0)
    assert names(h) == ["no_phantom_delivery"]


# -- one_position_per_message ---------------------------------------------------------------------


def test_one_publish_stored_at_two_positions_is_a_violation() -> None:
    """r12: the call acknowledged seg 3, its message had been delivered from seg 2 as well."""
    h = H().topic().join()
    h.at(1).deliver("twice", 2)
    h.at(2).publish("twice", 3)
    assert names(h) == ["one_position_per_message"]


def test_a_publish_delivered_where_it_was_acknowledged_and_retried_tags_are_no_violation() -> None:
    h = H().topic().join()
    h.at(1).publish("once", 0)
    h.at(2).deliver("once", 0, lease_s=1.0)
    h.at(10).deliver("once", 0)  # redelivered at the same position after the lease ended
    # an idempotent publish retried by the app: two calls, one tag (dedup_stored_once judges it)
    h.at(11).publish("retried", 1, dedup="d1")
    h.at(12).publish("retried", 1, dedup="d1", duplicate=True)
    assert "one_position_per_message" not in names(h)
    h.at(13).deliver("once", 5)
    assert "one_position_per_message" in names(h), "the check is live in this history"


# -- job commits -----------------------------------------------------------------------------------


def _committed_job(*tags: str) -> H:
    """A group subscribed, then job ``j`` (its messages in one chunk at seq 0) ran and committed."""
    h = H().topic().join().at(1)
    h.txn("j", "pending", [None])
    h.at(2).txn("j", "committed", [0])
    return h.job("j", list(tags))


def test_a_job_received_in_part_or_never_committed_is_a_violation() -> None:
    h = _committed_job("j.0", "j.1")
    h.at(3).deliver("j.0", 0, idx=0)
    assert "job_all_or_nothing" in names(h)
    h.at(4).deliver("j.1", 0, idx=1)
    assert names(h) == []
    # every run failed and the store never shows a commit: nothing of it may be delivered
    h = H().topic().join().at(1).txn("j", "pending", [0]).job("j", ["j.0", "j.1"], "error")
    h.at(2).txn("j", "aborted", [0])
    h.at(3).deliver("j.0", 0)
    assert "job_all_or_nothing" in names(h)
    # the same without a journal (a history of real processes): no run returned OK
    h = H().topic().join().at(1).job("j", ["j.0"], "error")
    h.at(3).deliver("j.0", 0)
    assert names(h) == ["job_all_or_nothing"]


def test_a_group_that_subscribed_after_the_commit_may_see_part_of_a_job() -> None:
    h = _committed_job("j.0", "j.1")
    h.at(3).deliver("j.0", 0, idx=0)
    h.deliver("j.1", 0, idx=1)
    h.at(5).join(group="late", member="m9")  # e.g. `latest`, started after part of the job
    h.at(6).deliver("j.1", 0, idx=1, group="late", member="m9")
    assert names(h) == []


def test_a_job_message_received_as_two_copies_is_a_violation() -> None:
    h = _committed_job("j.0")
    h.at(3).deliver("j.0", 0)
    h.at(40).deliver("j.0", 0)  # the lease expired: the same copy again is fine
    assert names(h) == []
    h.at(80).deliver("j.0", 0, msg_id="another-id")  # a second copy (another message id)
    assert names(h) == ["job_one_copy"]
    h = _committed_job("j.0")
    h.at(3).deliver("j.0", 0)
    h.at(4).deliver("j.0", 1)  # a duplicate append of the chunk (which its record does not show)
    assert set(names(h)) == {"job_one_copy", "job_no_pending_delivery"}


def test_a_job_committed_twice_is_a_violation() -> None:
    h = _committed_job("j.0")
    h.at(3).deliver("j.0", 0)
    h.at(9).txn("j", "deleted", [])
    h.at(10).txn("j", "pending", [None]).txn("j", "committed", [7])  # a rerun committed it again
    assert names(h) == ["job_one_copy"]


def test_a_committed_job_never_delivered_is_a_violation() -> None:
    h = _committed_job("j.0", "j.1")
    h.at(100).add("phase", name="end")
    assert names(h) == ["job_committed_delivered"]
    # a crashed run that committed (the journal shows it) counts as well
    h = H().topic().join().at(1).txn("j", "committed", [0])
    h.ret(h.call("job", "job.j#1", job="j", topic="t", run="r1", tags=["j.0"]), "crashed")
    assert names(h) == ["job_committed_delivered"]
    # a group that joined after the job began is not owed it
    h = H().topic().at(1).txn("j", "committed", [0]).job("j", ["j.0"]).at(2).join()
    assert names(h) == []


def test_a_message_of_a_pending_transaction_delivered_is_a_violation() -> None:
    h = H().topic().join().at(1).txn("j", "pending", [0])
    h.at(2).deliver("j.0", 0)  # the chunk landed, but the record is still pending
    h.at(3).txn("j", "committed", [0]).job("j", ["j.0"])
    assert names(h) == ["job_no_pending_delivery"]
    h = H().topic().join().at(1).txn("j", "pending", [0])
    h.at(3).txn("j", "committed", [0]).job("j", ["j.0"])
    h.at(4).deliver("j.0", 0)
    assert names(h) == []


def test_a_committed_jobs_chunk_deleted_before_its_segment_is_a_violation() -> None:
    """I18 in the checker: ``job_chunks_kept``."""
    h = _committed_job("j.0")
    h.events[-3]["refs"] = {"0": [["j/r/t0-a0/p0000-000000.arrow"]]}  # the committed record's chunks
    h.at(3).deliver("j.0", 0)
    h.at(5).add("del", topic="t", partition=0, seq=0)  # retention frees the reference segment...
    h.at(6).add("del", topic="t", chunk="j/r/t0-a0/p0000-000000.arrow")  # ...then its chunks
    h.at(7).add("del", topic="t", chunk="j/r/t0-a1/p0000-000000.arrow")  # a failed attempt's: any time
    assert names(h) == []
    h = _committed_job("j.0")
    h.events[-3]["refs"] = {"0": [["j/r/t0-a0/p0000-000000.arrow"]]}
    h.at(3).add("del", topic="t", chunk="j/r/t0-a0/p0000-000000.arrow")  # while the segment is stored
    h.at(4).deliver("j.0", 0)
    assert "job_chunks_kept" in names(h)


def test_histories_are_json_lines() -> None:
    h = H().topic().join().at(1).publish("a", 0)
    h.at(2).deliver("a", 0)
    assert from_jsonl(to_jsonl(h.events)) == h.events


# -- clock_reported (I15) and clocks beyond the margin ----------------------------------------------


def _clock(h: H, proc: str, offset: float, warned: bool | None) -> None:
    h.add("clock", proc=proc, offset=offset, warned=warned)


def test_a_clock_beyond_the_margin_must_be_reported_and_one_within_it_must_not() -> None:
    params = {"consumer": {"clock_skew_s": 2.0}}
    h = H(**params)
    _clock(h, "gc#1", 600.0, True)
    _clock(h, "prod#1", 0.4, False)
    _clock(h, "member.m1#1", 2.5, False)  # within the margin plus the store's resolution: either way
    assert names(h) == []
    for offset, warned in ((600.0, False), (-30.0, None), (0.3, True)):
        h = H(**params)
        _clock(h, "p#1", offset, warned)
        assert names(h) == ["clock_reported"], (offset, warned)
    h = H(**params)
    _clock(h, "gc#1", 600.0, True)
    h.ret(h.call("gc", "gc#1"), clock_warning=False)  # a collection that said nothing
    assert names(h) == ["clock_reported"]


def test_leases_between_clocks_apart_beyond_the_margin_are_not_promised() -> None:
    h = H(consumer={"clock_skew_s": 2.0}).topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30, skew=0.0)
    h.at(20).deliver("a", 0, member="m2", skew=25.0)  # m2's clock 25 s ahead: it thinks the lease ran out
    assert names(h) == []  # (clock_reported checks that m2 said so)
    h = H(consumer={"clock_skew_s": 2.0}).topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30, skew=0.0)
    h.at(20).deliver("a", 0, member="m2", skew=1.0)
    assert names(h) == ["exclusive_lease"]
    # m3, 25 s ahead, took m1's live lease and gave it back: m1 claims it again
    h = H(consumer={"clock_skew_s": 2.0})
    _clock(h, "member.m1#1", 0.0, False)
    _clock(h, "member.m3#1", 25.0, True)
    h.topic().join().join(member="m3").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, member="m1", lease_s=30)
    h.at(3).deliver("a", 0, member="m1", lease_s=30)
    assert names(h) == []


# -- foreign_objects_kept (I8) ---------------------------------------------------------------------


def test_a_foreign_object_deleted_is_a_violation_unless_its_topic_was() -> None:
    h = H().topic()
    h.add("foreign", key="t/p0000/seg/.keep", kept=True)
    assert names(h) == []
    h.add("foreign", key="t/subs/Archive/README.txt", kept=False)
    assert names(h) == ["foreign_objects_kept"]
    h = H().topic()
    h.ret(h.call("delete_topic", "operator.t#1", topic="t"))
    h.add("foreign", key="t/p0000/seg/.keep", kept=False)  # the deletion purged its prefix
    h.add("foreign", key="_registry/members/t/g/README.txt", kept=False)
    assert names(h) == []


# -- lease_redelivered (I16) -----------------------------------------------------------------------

LIVENESS = {"consumer": {"clock_skew_s": 2.0, "steal_after_s": 2.0}, "lease_liveness": True}


def _done(h: H, receipt: str, tag: str = "a") -> None:
    """The app acks the last delivery: its own lease never runs out."""
    h.settle("ack", receipt, tag, 0, member=receipt.split(":")[-1].split("-")[0])


def test_an_expired_lease_must_come_back_within_the_bound() -> None:
    # the lease runs out at 12; bound: 12 + 2 x 2 (margin) + 2 (owner's priority) + 5 = 23
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    h.at(2).deliver("a", 0, lease_s=10)
    _done(h, h.at(22).deliver("a", 0))
    h.at(100).add("phase", name="end")
    assert names(h) == []
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    h.at(2).deliver("a", 0, lease_s=10)
    _done(h, h.at(30).deliver("a", 0))
    h.at(100).add("phase", name="end")
    assert names(h) == ["lease_redelivered"]
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    h.at(2).deliver("a", 0, lease_s=10)  # never again
    h.at(100).add("phase", name="end")
    assert names(h) == ["lease_redelivered"]


def test_a_lease_only_a_dead_holder_knew_of_is_not_required_but_a_later_joiner_knows_it() -> None:
    h = H(**LIVENESS).topic().join().join(member="m2").at(1).publish("a", 0)
    h.at(2).deliver("a", 0, lease_s=10)
    h.at(3).add("crash", proc="member.m1#1")
    _done(h, h.at(40).deliver("a", 0, member="m2"))  # m2 joined before the claim: not a witness
    h.at(100).add("phase", name="end")
    assert names(h) == []
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    h.at(2).deliver("a", 0, lease_s=10)
    h.at(3).add("crash", proc="member.m1#1")
    h.at(4).join(member="m3")  # joined after the delivery: its join read the lease
    _done(h, h.at(40).deliver("a", 0, member="m3"))
    h.at(100).add("phase", name="end")
    assert names(h) == ["lease_redelivered"]


def test_a_settled_lease_or_one_outside_the_checked_phase_is_not_required() -> None:
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=10)
    h.at(5).settle("ack", r, "a", 0)
    h.at(100).add("phase", name="end")
    assert names(h) == []
    h = H(consumer={"clock_skew_s": 2.0}).topic().join().at(1).publish("a", 0)  # chaos phase only
    h.at(2).deliver("a", 0, lease_s=10)
    _done(h, h.at(40).deliver("a", 0))
    h.at(50).add("phase", name="quiesce")
    h.at(100).add("phase", name="end")
    assert names(h) == []


def test_a_replica_of_an_earlier_incarnation_is_not_compared() -> None:
    h = H()
    h.add("replica", topic="t", group="g", partition=0, member="m1", state={"n": 9}, incarnation="old")
    h.add("fresh", topic="t", group="g", partition=0, state={"n": 2}, incarnation="new")
    assert names(h) == []
    h.add("replica", topic="t", group="g", partition=0, member="m2", state={"n": 3}, incarnation="new")
    assert names(h) == ["replicas_converge"]


# -- settlement_honoured (I4, I20) -----------------------------------------------------------------


def test_a_settlement_refused_while_its_lease_lives_is_a_violation() -> None:
    # the lease lives until 32 (margin 2 x 2): a "lease lost" at 5 is the engine refusing the holder
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=30)
    h.at(5).settle("nack", r, "a", 0, outcome="error", error="LeaseLost", requeue=False)
    _done(h, h.at(33).deliver("a", 0))
    h.at(100).add("phase", name="end")
    assert "settlement_honoured" in names(h)
    # refused after the lease ran out: another member may hold it by then
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=10)
    h.at(13).settle("ack", r, "a", 0, outcome="error", error="LeaseLost")
    _done(h, h.at(14).deliver("a", 0))
    h.at(100).add("phase", name="end")
    assert "settlement_honoured" not in names(h)


def test_a_settlement_refused_after_a_seek_or_outside_the_checked_phase_is_not_judged() -> None:
    h = H(**LIVENESS).topic().join().at(1).publish("a", 0)
    r = h.at(2).deliver("a", 0, lease_s=30)
    h.ret(h.call("seek", "admin", group="g", topic="t", target="earliest"))
    h.at(5).settle("ack", r, "a", 0, outcome="error", error="LeaseLost")
    _done(h, h.at(6).deliver("a", 0))
    h.at(100).add("phase", name="end")
    assert "settlement_honoured" not in names(h)
    h = H(consumer={"clock_skew_s": 2.0}).topic().join().at(1).publish("a", 0)  # chaos phase only
    r = h.at(2).deliver("a", 0, lease_s=30)
    h.at(5).settle("ack", r, "a", 0, outcome="error", error="LeaseLost")
    _done(h, h.at(33).deliver("a", 0))
    h.at(100).add("phase", name="end")
    assert "settlement_honoured" not in names(h)
