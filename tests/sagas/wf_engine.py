"""Workflows for the engine tests. Worker processes load them with SAGAS_MODULES."""

from __future__ import annotations

import json
import os
import time

from django.db import connection

from sagas import Context, workflow


def record_call(
    run_id: str, step: str, first_sleep: float = 0.0, payload: dict | None = None, pause: float = 0.0
) -> str:
    """Count a real execution in test_step_calls; sleep ``first_sleep`` on the first one only,
    and ``pause`` on every one."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO test_step_calls (run_id, step, pid, payload) VALUES (%s, %s, %s, %s) RETURNING "
            "(SELECT count(*) FROM test_step_calls WHERE run_id = %s AND step = %s)",
            [run_id, step, os.getpid(), json.dumps(payload), run_id, step],
        )
        earlier = cur.fetchone()[0]
    if first_sleep and earlier == 0:
        time.sleep(first_sleep)
    if pause:
        time.sleep(pause)
    return f"{step}-done"


@workflow("five_steps", version=1)
def five_steps(ctx: Context, spec: dict) -> list:
    results = []
    for i in range(1, 6):
        sleep = spec.get("slow_step3", 0.0) if i == 3 else spec.get("each", 0.0)
        results.append(ctx.step(f"s{i}", record_call, ctx.run_id, f"s{i}", sleep))
    return results


@workflow("nd_order", version=1)
def nd_order(ctx: Context, spec: dict) -> str:
    # Reads the environment outside a step: exactly the bug replay must catch.
    for name in os.environ.get("ND_ORDER", "ab"):
        ctx.step(name, record_call, ctx.run_id, name)
    ctx.step("c", record_call, ctx.run_id, "c")
    return "done"


@workflow("recorded_values", version=1)
def recorded_values(ctx: Context, spec: dict) -> dict:
    now, rnd, uid = ctx.now(), ctx.random(), ctx.uuid()
    values = {"now": now.isoformat(), "random": rnd, "uuid": str(uid)}
    ctx.step("remember", record_call, ctx.run_id, "remember", 0.0, values)
    ctx.step("after", record_call, ctx.run_id, "after")
    return values


@workflow("slow_steps", version=1)
def slow_steps(ctx: Context, spec: dict) -> int:
    for i in range(spec["steps"]):
        ctx.step("tick", record_call, ctx.run_id, f"tick{i}", 0.0, None, spec.get("pause", 0.0))
    return spec["steps"]
