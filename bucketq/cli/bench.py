"""``bucketq bench``: run the benchmark scenarios on a backend it starts itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from bucketq.cli.errors import EXIT_ERROR, CliError, fail, out, run, stderr

if TYPE_CHECKING:
    from bucketq.bench.params import BenchParams


class BenchBackend(StrEnum):
    moto = "moto"
    seaweedfs = "seaweedfs"
    file = "file"
    memory = "memory"


class Via(StrEnum):
    library = "library"
    sidecar = "sidecar"


class Scenario(StrEnum):
    publish = "publish"
    consume = "consume"
    e2e = "e2e"
    latency = "latency"
    idle = "idle"
    cost = "cost"
    awaited = "awaited"
    one_at_a_time = "one-at-a-time"


# The scenarios --via sidecar runs through their own runners, each alone (the rest of --via
# sidecar is the e2e run over HTTP)
VIA_SIDECAR_ALONE = ("idle", "one-at-a-time")


class Profile(StrEnum):
    latency = "latency"
    balanced = "balanced"
    economy = "economy"


def parse_rates(text: str) -> list[float]:
    """``"1,10,50"`` as msgs/s rates (each positive)."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"invalid --rates {text!r}: use comma-separated msgs/s, e.g. 1,10,50") from None
    if not rates or any(rate <= 0 for rate in rates):
        raise CliError(f"invalid --rates {text!r}: every rate must be a positive msgs/s")
    return rates


def parse_tuning(items: list[str]) -> dict[str, Any]:
    """``["producer.linger_ms=5", "strategy=conditional_write"]`` as nested Settings fields."""
    out: dict[str, Any] = {}
    for item in items:
        path, sep, text = item.partition("=")
        if not sep or not path:
            raise CliError(f"invalid --set {item!r}: use --set field=value, e.g. producer.linger_ms=5")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def bench(
    backend: BenchBackend = typer.Option(BenchBackend.memory, "--backend", "-b", help="Store to run on."),
    scenario: list[Scenario] = typer.Option(
        [],
        "--scenario",
        "-s",
        help="Scenario to run (repeatable). \\[default: publish, consume, e2e, latency]",
        show_default=False,
    ),
    messages: int = typer.Option(
        10_000, "--messages", "-n", min=1, help="Messages per run (per rate of 'cost')."
    ),
    consumers: int = typer.Option(4, "--consumers", min=1, help="Consumers (each its own connection)."),
    producers: int = typer.Option(4, "--producers", min=1, help="Producers (each its own connection)."),
    partitions: int = typer.Option(4, "--partitions", min=1, help="Partitions of the bench topic."),
    payload_bytes: int = typer.Option(200, "--payload-bytes", min=0, help="Size of each JSON payload."),
    latency_rate: float = typer.Option(
        50.0, "--latency-rate", min=0.1, help="Publish rate of 'latency' (msg/s)."
    ),
    latency_messages: int = typer.Option(
        500, "--latency-messages", min=1, help="Messages of 'latency' (at most)."
    ),
    warmup: float = typer.Option(
        1.0,
        "--warmup",
        min=0,
        help="Seconds consumers idle before 'latency', 'cost' and 'awaited' start (membership settles).",
    ),
    idle_timeout: float = typer.Option(
        60.0, "--timeout", min=1, help="Give up a run after this long idle (s)."
    ),
    profile: Profile | None = typer.Option(
        None,
        "--profile",
        help="Engine profile of every connection. \\[default: the engine's default]",
        show_default=False,
    ),
    idle_seconds: float = typer.Option(
        120.0, "--idle-seconds", min=0.1, help="'idle': how long each member count idles (s)."
    ),
    idle_warmup: float = typer.Option(
        15.0, "--idle-warmup", min=0, help="'idle': first seconds of each idle phase not measured."
    ),
    silence_seconds: float = typer.Option(
        60.0, "--silence-seconds", min=0, help="'idle': silence before each pickup message (s)."
    ),
    pickups: int = typer.Option(5, "--pickups", min=1, help="'idle': messages published after a silence."),
    rates: str = typer.Option(
        "1,10,50,500,5000", "--rates", help="'cost': publish rates (msgs/s, comma-separated)."
    ),
    rate_seconds: float = typer.Option(
        30.0, "--rate-seconds", min=0.1, help="'cost': seconds of publishing per rate (at most --messages)."
    ),
    tasks: int = typer.Option(8, "--tasks", min=1, help="'awaited': tasks sharing one producer."),
    one_messages: int = typer.Option(
        100, "--one-messages", min=1, help="'one-at-a-time': messages, each after the previous arrived."
    ),
    one_max_gap_ms: float = typer.Option(
        100.0,
        "--one-max-gap-ms",
        min=0,
        help="'one-at-a-time': the next publish comes a random 0 to this many ms after an arrival.",
    ),
    one_seed: int = typer.Option(0, "--one-seed", help="'one-at-a-time': seed of the gaps."),
    compare: bool = typer.Option(
        True,
        "--compare/--no-compare",
        help="'one-at-a-time' on an S3 server: run pawn-queue's listen() (50 ms polling) beside it.",
    ),
    one_push: bool = typer.Option(
        True, "--push/--no-push", help="'one-at-a-time --via sidecar': the push delivery too, after pull."
    ),
    service_ms: float | None = typer.Option(
        None,
        "--service-ms",
        min=0,
        help="memory backend: serve one request at a time, each taking this long (a model of a local "
        "single-threaded S3 server such as moto, at a chosen speed).",
    ),
    service_servers: int = typer.Option(
        1,
        "--service-servers",
        min=1,
        help="with --service-ms: requests the modelled server answers at a time (its cores).",
    ),
    tune: list[str] = typer.Option(
        [], "--set", help="Engine setting for every connection, e.g. producer.linger_ms=5."
    ),
    json_file: Path | None = typer.Option(None, "--json", help="Write the runs as a JSON list to this file."),
    via: Via = typer.Option(
        Via.library,
        "--via",
        help="library: in-process connections; sidecar: apps speaking HTTP to sidecar processes (e2e; "
        "with -s idle alone: idle sidecars whose apps long-poll; with -s one-at-a-time alone: two apps "
        "beside their sidecars, the consumer's pulling, then pushed to).",
    ),
    spark: bool = typer.Option(
        False,
        "--spark",
        help="Spark read and write on local[2] against df.write.json/spark.read.json instead "
        "(--backend file, moto or seaweedfs; wall and process-tree CPU seconds).",
    ),
) -> None:
    """Measure throughput, S3 requests and cost per message, latency, losses."""
    names = [s.value for s in scenario]
    alone_via_sidecar = via is Via.sidecar and len(names) == 1 and names[0] in VIA_SIDECAR_ALONE
    alone = [n for n in names if n in VIA_SIDECAR_ALONE]
    if via is Via.sidecar and alone and not alone_via_sidecar:
        raise typer.BadParameter(f"-s {alone[0]} --via sidecar runs on its own", param_hint="--via")
    if (via is Via.sidecar and not alone_via_sidecar) or spark:
        if service_ms is not None or service_servers != 1:
            raise typer.BadParameter(
                "models a server on --backend memory; --via sidecar and --spark run real servers",
                param_hint="--service-ms" if service_ms is not None else "--service-servers",
            )
        if spark and backend is BenchBackend.file:
            run(_bench_spark_file(messages, partitions, payload_bytes, json_file))
            return
        if backend not in (BenchBackend.moto, BenchBackend.seaweedfs):
            raise typer.BadParameter(
                "--via sidecar needs --backend moto or seaweedfs; --spark file, moto or seaweedfs",
                param_hint="--backend",
            )
        run(
            _bench_server(
                backend.value,
                "spark" if spark else "sidecar",
                messages,
                consumers,
                partitions,
                payload_bytes,
                json_file,
            )
        )
        return
    from bucketq.bench.params import SCENARIOS, BenchParams, ScenarioName

    try:
        tuning = parse_tuning(tune)
        if profile is not None:
            given = tuning.get("profile")
            if given is not None and given != profile.value:
                raise CliError(f"--profile {profile.value} and --set profile={given} disagree")
            tuning["profile"] = profile.value
        params = BenchParams(
            backend=backend.value,
            scenarios=cast("list[ScenarioName]", list(dict.fromkeys(s.value for s in scenario)))
            or list(SCENARIOS),
            messages=messages,
            producers=producers,
            consumers=consumers,
            partitions=partitions,
            payload_bytes=payload_bytes,
            latency_rate=latency_rate,
            latency_messages=latency_messages,
            warmup_s=warmup,
            idle_timeout_s=idle_timeout,
            tuning=tuning,
            idle_seconds=idle_seconds,
            idle_warmup_s=idle_warmup,
            silence_s=silence_seconds,
            pickups=pickups,
            rates=parse_rates(rates),
            rate_seconds=rate_seconds,
            tasks=tasks,
            one_messages=one_messages,
            one_max_gap_ms=one_max_gap_ms,
            one_seed=one_seed,
            compare=compare,
            one_push=one_push,
            service_ms=service_ms,
            service_servers=service_servers,
            via="sidecar" if alone_via_sidecar else "library",
        )
    except ValueError as exc:
        fail(CliError(f"invalid bench parameters: {exc}"))
    except CliError as exc:
        fail(exc)
    run(_bench(params, json_file))


async def _bench(params: BenchParams, json_file: Path | None) -> None:
    from bucketq.bench.backends import open_backend
    from bucketq.bench.report import write_json
    from bucketq.bench.runner import run_scenarios
    from bucketq.bench.tables import label, print_results

    console = out()
    backend = params.backend
    # a bar on a terminal only: not when piped, nor when the runs go to a JSON file (scripts, CI)
    with (
        bench_progress(show=stderr().is_terminal and json_file is None) as progress,
        open_backend(params.backend, params.tuning, params.service_ms, params.service_servers) as running,
    ):
        results = await run_scenarios(
            running, params, on_start=lambda name: progress.start(f"{name} on {backend}")
        )
    print_results(results, console)
    if json_file is not None:
        write_json(results, json_file)
        console.print(f"wrote {len(results)} run(s) to {json_file}")
    bad = [r for r in results if r.duplicates or r.lost or not r.completed]
    if bad:
        names = ", ".join(f"{label(r)} ({r.duplicates} duplicates, {r.lost} lost)" for r in bad)
        raise CliError(f"runs with problems: {names}", EXIT_ERROR)


class BenchProgress:
    """A progress bar of the scenario running: messages done (acked, or published for a run that
    only publishes) of those expected, summed over the runs' trackers
    (bucketq.bench.tracker.ACTIVE), refreshed a few times a second."""

    REFRESH_S = 0.25

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("starting", total=None, detail="")
        self.follower: asyncio.Task[None] | None = None

    def start(self, description: str) -> None:
        self.progress.reset(self.task, description=description, total=None, detail="")
        if self.follower is None:
            self.follower = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        from bucketq.bench.tracker import ACTIVE

        while True:
            running = [t for t in list(ACTIVE.values()) if not t.done.is_set()]
            if running:
                published = sum(len(t.published) for t in running)
                acked = sum(len(t.acks) for t in running)
                self.progress.update(
                    self.task,
                    total=sum(t.expected for t in running),
                    # what a publish-only run does is publish; the others are done when acked
                    completed=acked or published,
                    detail=f"{published:,} published, {acked:,} acked",
                )
            await asyncio.sleep(self.REFRESH_S)

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.cancel()


@contextlib.contextmanager
def bench_progress(show: bool) -> Iterator[BenchProgress]:
    """A bench progress display on stderr (drawn only when ``show``)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=stderr(),
        transient=True,
        disable=not show,
    ) as progress:
        tracker = BenchProgress(progress)
        try:
            yield tracker
        finally:
            tracker.stop()


async def _bench_server(
    backend: str,
    kind: str,
    messages: int,
    sidecars: int,
    partitions: int,
    payload_bytes: int,
    json_file: Path | None,
) -> None:
    """The sidecar (e2e over HTTP) or Spark benchmark on a server it starts; the same JSON list format."""
    import asyncio

    from bucketq.bench.servers import serve

    console = Console()
    with console.status(f"starting {backend}…"), serve(backend) as server:  # type: ignore[arg-type]
        bucket = server.new_bucket()
        if kind == "sidecar":
            from bucketq.bench.sidecar import run_via_sidecar

            record = await run_via_sidecar(
                server.endpoint_url,
                bucket,
                messages,
                sidecars,
                partitions,
                payload_bytes,
                access_key=server.access_key,
                secret_key=server.secret_key,
            )
            records = [record | {"backend": backend}]
        else:
            from bucketq.bench.spark import run_spark_bench

            settings = server.settings(bucket=bucket)
            records = await asyncio.to_thread(
                run_spark_bench, settings, backend, messages, partitions, payload_bytes
            )
    keys = (
        (
            "scenario",
            "messages",
            "msgs_per_s",
            "s3_requests_per_message",
            "p50_ms",
            "p99_ms",
            "duplicates",
            "lost",
            "rss_peak_mib",
        )
        if kind == "sidecar"
        else SPARK_COLUMNS
    )
    _print_records(console, records, keys, f"bucketq bench ({kind}, {backend})", json_file)
    bad = [r for r in records if r.get("duplicates") or r.get("lost")]
    if bad:
        raise CliError(f"runs with problems: {bad}", EXIT_ERROR)


SPARK_COLUMNS = (
    "scenario",
    "messages",
    "seconds",
    "cpu_s",
    "vs_json",
    "vs_json_cpu",
    "target",
    "bytes_per_message",
    "s3_requests_per_message",
)


async def _bench_spark_file(
    messages: int, partitions: int, payload_bytes: int, json_file: Path | None
) -> None:
    """The Spark benchmark on the file backend (a temporary directory; no server)."""
    import asyncio
    import tempfile

    from bucketq.bench.spark import run_spark_bench
    from bucketq.config import Settings

    console = Console()
    with tempfile.TemporaryDirectory(prefix="bucketq-bench-file-") as root:
        settings = Settings.from_dict({"backend": "file", "file_path": root, "strategy": "conditional_write"})
        with console.status("running spark on file…"):
            records = await asyncio.to_thread(
                run_spark_bench, settings, "file", messages, partitions, payload_bytes
            )
    _print_records(console, records, SPARK_COLUMNS, "bucketq bench (spark, file)", json_file)


def _print_records(
    console: Console, records: list[dict[str, Any]], keys: tuple[str, ...], title: str, json_file: Path | None
) -> None:
    from rich.table import Table

    table = Table(*keys, title=title)
    for rec in records:
        table.add_row(*(str(rec.get(k, "-")) for k in keys))
    console.print(table)
    if json_file is not None:
        json_file.write_text(json.dumps(records, indent=2) + "\n")
        console.print(f"wrote {len(records)} run(s) to {json_file}")
