"""The busy worker's workflow in ``bench/engine.py``'s dispatch-beside-load measurement
(``SAGAS_MODULES=bench.workflows_busy``), in a module of its own.

A worker takes a run from PostgreSQL's dispatch announcement whenever it has the run's code
and a free thread, whatever its queue prefix. Each worker there loads only its own kind of
workflow, so the measured worker never takes a busy run and the busy worker never takes a
measured one: the load beside the measured worker is the machine's, not work it does."""

from __future__ import annotations

from sagas import Context, workflow


def _pure(i: int) -> int:
    return i * 2


@workflow("bench_busy20", version=1)
def bench_busy20(ctx: Context, _input: dict) -> int:
    total = 0
    for i in range(20):
        total += ctx.step("s", _pure, i)
    return total
