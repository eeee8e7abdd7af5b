"""Run the chosen scenarios on one backend (starting its server once) and collect the results."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable

from bucketq.bench.backends import Backend
from bucketq.bench.cost import run_awaited, run_cost
from bucketq.bench.idle import run_idle
from bucketq.bench.one_at_a_time import run_one_at_a_time
from bucketq.bench.params import BenchParams, ScenarioName
from bucketq.bench.report import RunResult
from bucketq.bench.scenarios import run_consume, run_e2e, run_latency, run_publish

ResultFn = Callable[[RunResult], None]
StartFn = Callable[[str], None]
ScenarioFn = Callable[[Backend, BenchParams], Awaitable[list[RunResult]]]


def _single(fn: Callable[[Backend, BenchParams], Awaitable[RunResult]]) -> ScenarioFn:
    async def run(backend: Backend, params: BenchParams) -> list[RunResult]:
        return [await fn(backend, params)]

    return run


# A scenario gives one result, or several (``cost``: one per rate).
SCENARIO_RUNNERS: dict[ScenarioName, ScenarioFn] = {
    "publish": _single(run_publish),
    "consume": _single(run_consume),
    "e2e": _single(run_e2e),
    "latency": _single(run_latency),
    "idle": run_idle,
    "cost": run_cost,
    "awaited": run_awaited,
    "one-at-a-time": run_one_at_a_time,
}


async def run_scenarios(
    backend: Backend,
    params: BenchParams,
    *,
    on_start: StartFn | None = None,
    on_result: ResultFn | None = None,
) -> list[RunResult]:
    """Every scenario of ``params`` in order, on an already running backend."""
    results = []
    for name in params.scenarios:
        if on_start is not None:
            on_start(name)
        gc.collect()
        for result in await SCENARIO_RUNNERS[name](backend, params):
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
