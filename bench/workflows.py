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


@workflow("bench_effects10", version=1)
def bench_effects10(ctx: Context, spec: dict) -> int:
    """Ten ledgered effects on one connector (``spec['connector']``)."""
    for i in range(10):
        if spec["connector"] == "payments.capture":
            payload = {"order": f"{ctx.run_id}-{i}", "amount_cents": 100 + i, "currency": "EUR"}
        else:
            payload = {"to": "bench@example.com", "subject": f"{ctx.run_id}-{i}", "body": "bench"}
        ctx.effect("e", spec["connector"], payload)
    return 10


@workflow("bench_steps10", version=1)
def bench_steps10(ctx: Context, spec: dict) -> int:
    for i in range(10):
        ctx.step("s", _pure, i)
    return 10
