"""Write jobs are atomic and idempotent: S3 refusing the commit's PUTs, a driver killed during the
commit, a ``jobId`` run again after success, failure or abort, and pipelines run twice."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from bucketq import Bucketq, Settings
from bucketq.core.keys import Keys
from bucketq.core.txn import list_txns, read_txn
from bucketq.spark import pipelines
from bucketq.spark import redrive as cursor_ops
from bucketq.spark.commit import read_report
from bucketq.spark.options import resolve_settings, settings_options
from bucketq.storage import open_storage
from tests.spark.spark_helpers import RefusingProxy, keys_under, publish_many
from tests.support.servers import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.s3]


async def _create(settings: Settings, topic: str, partitions: int) -> None:
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=partitions)


def _rows(spark: Any, n: int) -> Any:
    """``n`` keyed JSON rows spread over every partition."""
    return spark.range(n, numPartitions=2).selectExpr(
        "to_json(named_struct('n', id)) AS payload", "concat('k', CAST(id % 97 AS STRING)) AS key"
    )


def _save(df: Any, options: dict[str, str], topic: str, **extra: Any) -> None:
    w = df.write.format("bucketq").options(**options).option("topic", topic).mode("append")
    w.options(**{k: str(v) for k, v in extra.items()}).save()


def _visible(spark: Any, settings: Settings, topic: str) -> list[int]:
    """The ``n`` of every message a reader sees, sorted."""
    df = spark.read.format("bucketq").options(**settings_options(settings)).option("topic", topic).load()
    return sorted(json.loads(r["payload"])["n"] for r in df.select("payload").collect())


async def _txns(settings: Settings, topic: str) -> list[tuple[str, str]]:
    """(id, state) of the topic's transaction records."""
    keys = Keys(settings.root)
    async with await open_storage(settings) as storage:
        out = []
        for txn in await list_txns(storage, keys, topic):
            found = await read_txn(storage, keys, topic, txn)
            assert found is not None
            out.append((txn, found[0].state))
        return out


async def _consume_all(settings: Settings, topic: str, expected: int, idle_s: float = 2.0) -> list[int]:
    """Every message an engine consumer gets (acked): ``expected`` of them, then ``idle_s`` of quiet
    to show there is nothing more."""
    fast = Settings.from_dict(
        settings.model_dump(mode="json") | {"consumer": {"poll_min_ms": 5, "poll_max_ms": 50}}
    )
    got: list[int] = []
    async with Bucketq(fast) as bq:
        consumer = await bq.register_consumer("checker", topic)
        deadline = time.monotonic() + 120
        quiet_until = None
        while time.monotonic() < deadline:
            batch = await consumer.poll(max_messages=500, wait=0.3)
            got += [int(m.payload["n"]) for m in batch]
            await asyncio.gather(*(m.ack() for m in batch))
            if len(got) >= expected:
                quiet_until = quiet_until or time.monotonic() + idle_s
                if time.monotonic() > quiet_until:
                    break
        await consumer.close()
    return sorted(got)


def test_refused_commit_leaves_nothing_visible_and_the_rerun_writes_once(
    spark: Any, moto_server: S3Server, bucket: Settings, options: dict[str, str]
) -> None:
    asyncio.run(_create(bucket, "ledger", 4))
    n = 800  # two tasks, four partitions, batches of 50: about two chunks per task and partition
    with RefusingProxy(moto_server.endpoint_url) as proxy:
        # S3 refuses every segment PUT of partition 1 (the chunk PUTs go through)
        proxy.refuse("PUT", rf"/{bucket.s3_bucket}/ledger/p0001/seg/")
        with pytest.raises(Exception, match="nothing of it is visible"):
            _save(
                _rows(spark, n),
                options | {"endpoint": proxy.url},
                "ledger",
                jobId="ledger-1",
                batchMessages=50,
                txnTimeout=12,
            )
        assert proxy.refused > 0
    # the other partitions' segments were appended, but no reader shows them
    appended = asyncio.run(keys_under(bucket, "ledger/p0000/seg/"))
    assert appended
    assert _visible(spark, bucket, "ledger") == []
    assert asyncio.run(_txns(bucket, "ledger")) == [("ledger-1.000001", "aborted")]
    assert asyncio.run(keys_under(bucket, "ledger/chunk/")) == []  # the aborted run's chunks went
    assert asyncio.run(read_report(resolve_settings(options), "ledger-1")) is None

    # the same job again, S3 healthy: everything, exactly once, for Spark and for consumers
    _save(_rows(spark, n), options, "ledger", jobId="ledger-1", batchMessages=50)
    assert _visible(spark, bucket, "ledger") == list(range(n))
    assert asyncio.run(_consume_all(bucket, "ledger", n)) == list(range(n))
    assert asyncio.run(_txns(bucket, "ledger")) == [
        ("ledger-1.000001", "aborted"),
        ("ledger-1.000002", "committed"),
    ]


KILLED_JOB = textwrap.dedent(
    """
    import json, sys
    from bucketq.spark.session import local_session

    options, n = json.loads(sys.argv[1]), int(sys.argv[2])
    spark = local_session("killed-driver", master="local[1]")
    df = spark.range(n, numPartitions=2).selectExpr(
        "to_json(named_struct('n', id)) AS payload", "concat('k', CAST(id % 97 AS STRING)) AS key"
    )
    df.write.format("bucketq").options(**options).mode("append").save()
    print("finished")
    """
)


@pytest.mark.timeout(600)
def test_driver_killed_during_commit_then_rerun_leaves_exactly_one_copy(
    spark: Any, moto_server: S3Server, bucket: Settings, options: dict[str, str], tmp_path: Path
) -> None:
    asyncio.run(_create(bucket, "orders", 3))
    n = 600  # two tasks, three partitions, batches of 50: about two chunks per task and partition
    script = tmp_path / "job.py"
    script.write_text(KILLED_JOB)
    seg = rf"/{bucket.s3_bucket}/orders/p000(\d)/seg/"
    with RefusingProxy(moto_server.endpoint_url) as proxy:
        # partition 2's reference segments never get through: the kill lands after partition
        # 0's is in and while partition 2's is on its way, whatever the machine's speed
        proxy.hold("PUT", rf"/{bucket.s3_bucket}/orders/p0002/seg/")
        job_options = options | {
            "endpoint": proxy.url,
            "topic": "orders",
            "jobId": "nightly",
            "batchMessages": "50",
        }

        def mid_commit() -> bool:
            """Partition 0's segment is stored and partition 2's PUT is held."""
            stored = {
                found[1]
                for method, path, status in proxy.answered
                if method == "PUT" and status == 200 and (found := re.search(seg, path))
            }
            return "0" in stored and bool(proxy.held)

        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": os.getcwd()}
        proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(job_options), str(n)],
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 240
            while not proxy.wait_until(mid_commit, timeout=1) and proc.poll() is None:
                assert time.monotonic() < deadline, "the commit never reached partition 2"
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-commit
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert asyncio.run(_txns(bucket, "orders")) == [("nightly.000001", "pending")]
    landed = [k for k in asyncio.run(keys_under(bucket, "orders/p")) if "/seg/" in k]
    assert landed, "the commit had appended segments when the driver died"
    assert asyncio.run(keys_under(bucket, "orders/chunk/nightly/"))  # the dead run's chunks
    # readers stop before the unfinished transaction: nothing of the job is visible
    assert _visible(spark, bucket, "orders") == []

    # the same job again: the dead run's commit is finished from its chunks, exactly once
    _save(_rows(spark, n), options, "orders", jobId="nightly", batchMessages=50)
    assert _visible(spark, bucket, "orders") == list(range(n))
    assert asyncio.run(_txns(bucket, "orders")) == [("nightly.000001", "committed")]
    report = asyncio.run(read_report(resolve_settings(options), "nightly"))
    assert report is not None and report["recovered"] and report["messages"] == n
    # the dead run's chunks are the job's; the rerun wrote none of its own that stayed
    assert len(asyncio.run(keys_under(bucket, "orders/chunk/"))) == report["chunks"] > 0
    # and once more: a no-op
    _save(_rows(spark, n), options, "orders", jobId="nightly", batchMessages=50)
    assert len(_visible(spark, bucket, "orders")) == n


def test_job_id_is_idempotent_after_success_and_after_failure(
    spark: Any, bucket: Settings, options: dict[str, str]
) -> None:
    asyncio.run(_create(bucket, "events", 2))
    _save(_rows(spark, 1000), options, "events", jobId="daily")
    first = asyncio.run(read_report(resolve_settings(options), "daily"))
    assert first is not None and not first.get("skipped")
    _save(_rows(spark, 1000), options, "events", jobId="daily")  # success before: nothing again
    assert _visible(spark, bucket, "events") == list(range(1000))
    again = asyncio.run(read_report(resolve_settings(options), "daily"))
    assert again is not None and {k: again[k] for k in first} == first  # the committed run's report
    assert again["skipped"] and not again["input_changed"]

    # finding 6: the same jobId with other rows wrote nothing and said nothing; now it is reported
    other = spark.range(1000, 1500, numPartitions=2).selectExpr("to_json(named_struct('n', id)) AS payload")
    _save(other, options, "events", jobId="daily")
    changed = asyncio.run(read_report(resolve_settings(options), "daily"))
    assert changed is not None and changed["skipped"] and changed["input_changed"]
    assert changed["rerun_input"]["rows"] == 500 and changed["input"]["rows"] == 1000
    with pytest.raises(Exception, match="committed before with other input"):
        _save(other, options, "events", jobId="daily", changedInput="fail")
    assert _visible(spark, bucket, "events") == list(range(1000))

    # a job whose task fails is aborted; the same jobId then runs normally (the abort is per run)
    # (the second task writes chunks of 40 rows before it meets row 580)
    bad = spark.range(600, numPartitions=2).selectExpr(
        "IF(id = 580, 'not json', to_json(named_struct('n', id + 1000))) AS payload"
    )
    with pytest.raises(Exception, match="InvalidMessage"):
        _save(bad, options, "events", jobId="hourly", batchMessages=40)
    assert asyncio.run(keys_under(bucket, "_spark/aborted/hourly/"))
    good = spark.range(600, numPartitions=2).selectExpr("to_json(named_struct('n', id + 1000)) AS payload")
    _save(good, options, "events", jobId="hourly", batchMessages=40)
    _save(good, options, "events", jobId="hourly", batchMessages=40)
    assert _visible(spark, bucket, "events") == list(range(1600))
    assert asyncio.run(keys_under(bucket, "_spark/")) == [
        k for k in asyncio.run(keys_under(bucket, "_spark/")) if k.startswith("_spark/jobs/")
    ]


def test_backfill_and_export_run_twice_add_nothing(spark: Any, bucket: Settings, tmp_path: Path) -> None:
    asyncio.run(publish_many(bucket, "source", 300, partitions=2, make=lambda i: {"payload": {"n": i}}))
    out = str(tmp_path / "export")
    assert pipelines.export(spark, bucket, "source", out, "json", show=False) == 300
    assert pipelines.export(spark, bucket, "source", out, "json", show=False) == 300  # a no-op
    first = pipelines.backfill(spark, bucket, out, "json", "copy", partitions=2, show=False)
    second = pipelines.backfill(spark, bucket, out, "json", "copy", show=False)
    assert first["messages"] == 300 and second.get("skipped")
    assert _visible(spark, bucket, "copy") == list(range(300))

    # an overlapping dataset (the old export plus new messages): only the new ids are added
    asyncio.run(publish_many(bucket, "source", 50, create=False, make=lambda i: {"payload": {"n": 300 + i}}))
    bigger = str(tmp_path / "export2")
    assert pipelines.export(spark, bucket, "source", bigger, "parquet", show=False) == 350
    third = pipelines.backfill(spark, bucket, bigger, "parquet", "copy", show=False)
    assert third["messages"] == 50
    assert _visible(spark, bucket, "copy") == list(range(350))

    # an export that died half-way left only Spark files behind: the next run replaces them
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "part-00000-dead.json").write_text('{"id": "x"}\n')
    assert pipelines.export(spark, bucket, "source", str(partial), "json", show=False) == 350
    with pytest.raises(Exception, match="holds another export"):
        pipelines.export(spark, bucket, "copy", str(partial), "json", show=False)


def test_redrive_resumes_a_round_that_died_before_its_acks(spark: Any, moto_server: S3Server) -> None:
    settings = moto_server.settings(
        strategy="conditional_write", consumer={"poll_min_ms": 5, "poll_max_ms": 40}
    )
    asyncio.run(publish_many(settings, "orders", 20, partitions=2))

    async def dead_letter_all() -> set[str]:
        async with Bucketq(settings) as bq:
            consumer = await bq.register_consumer("billing", "orders")
            got: list[Any] = []
            while len(got) < 20:
                got += await consumer.poll(max_messages=20, wait=5)
            for msg in got:
                await msg.dead_letter("timeout")
            await consumer.close()
            return {m.id for m in got}

    ids = asyncio.run(dead_letter_all())
    # a redrive round that claimed, committed its copies, and died before acking
    wanted: dict[int, list[tuple[int, int]]] = {}
    for r in (
        pipelines.read_topic(spark, settings, "orders.dlq").select("partition", "seq", "index").collect()
    ):
        wanted.setdefault(int(r["partition"]), []).append((int(r["seq"]), int(r["index"])))
    claims = asyncio.run(
        cursor_ops.claim(settings, "orders.dlq", "redrive", wanted, lease_s=1800, member="dead")
    )
    assert claims.count == 20
    intent = cursor_ops.RoundIntent("orders.dlq", "orders", "redrive", "redrive-crashed", claims)
    asyncio.run(cursor_ops.save_intent(settings, intent))
    pipelines._copy_claimed(
        spark, settings, "orders.dlq", "orders", claims, show=False, round_no=1, job=intent.job
    )

    report = pipelines.redrive(spark, settings, "orders.dlq", "orders", show=False)
    assert (report.moved, report.acked, report.lost) == (0, 20, 0)  # copies were there; acks finished
    redriven = pipelines.read_topic(spark, settings, "orders").where(
        "headers['bucketq-redrive-for'] = 'billing'"
    )
    assert sorted(r["id"] for r in redriven.select("id").collect()) == sorted(ids)  # each exactly once
    assert pipelines.redrive(spark, settings, "orders.dlq", "orders", show=False).moved == 0
    assert asyncio.run(cursor_ops.open_intents(settings, "orders.dlq", "redrive")) == []
