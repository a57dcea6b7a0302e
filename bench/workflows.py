"""Workflows used by the benchmarks (registered through SAGAS_MODULES=bench.workflows)."""

from __future__ import annotations

import os
import time

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


@workflow("bench_dispatch", version=1)
def bench_dispatch(ctx: Context, _input: dict) -> float:
    """Returns when its first step began executing (``time.time()`` in the worker), for
    dispatch latency: the bench compares it with its own clock just before ``start()``."""
    return ctx.step("t", time.time)


def _stamp_then_sleep(seconds: float) -> list[float]:
    began = time.time()
    time.sleep(seconds)
    return [began, os.getpid()]


@workflow("bench_sleepy", version=1)
def bench_sleepy(ctx: Context, spec: dict) -> int:
    """``spec['steps']`` steps that each journal when they began and in which process, then
    sleep ``spec['sleep']`` seconds: recovery finds the executing worker, and after a
    SIGKILL the first step another process journals."""
    for _ in range(spec["steps"]):
        ctx.step("s", _stamp_then_sleep, spec["sleep"])
    return spec["steps"]
