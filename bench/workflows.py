"""Workflows used by the benchmarks (registered through SAGAS_MODULES=bench.workflows)."""

from __future__ import annotations

from sagas import Context, workflow


def _pure(i: int) -> int:
    return i * 2


@workflow("bench_pure20", version=1)
def bench_pure20(ctx: Context, _input: dict) -> int:
    total = 0
    for i in range(20):
        total += ctx.step("s", _pure, i)
    return total


@workflow("bench_long", version=1)
def bench_long(ctx: Context, spec: dict) -> int:
    total = 0
    for i in range(spec["steps"]):
        total += ctx.step("s", _pure, i)
    return total
