"""Run the chosen scenarios on one backend (starting its server once) and collect the results."""

from __future__ import annotations

import gc
from collections.abc import Callable

from bucketq.bench.backends import Backend
from bucketq.bench.params import BenchParams
from bucketq.bench.report import RunResult
from bucketq.bench.scenarios import SCENARIO_RUNNERS

ResultFn = Callable[[RunResult], None]
StartFn = Callable[[str], None]


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
        result = await SCENARIO_RUNNERS[name](backend, params)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
