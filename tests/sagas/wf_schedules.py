"""Workflows for the schedule tests. Worker processes load them with SAGAS_MODULES."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, schedule, workflow
from tests.sagas.wf_engine import record_call


@workflow("sched_quick", version=1)
def sched_quick(ctx: Context, spec: dict) -> str:
    return ctx.step("tick", record_call, ctx.run_id, "tick")


@workflow("sched_hold", version=1)
def sched_hold(ctx: Context, spec: dict) -> str:
    """Goes on until it is told to (signal "go"): the run of one tick still going at the next."""
    ctx.step("begin", record_call, ctx.run_id, "begin")
    ctx.wait_for("go", timedelta(days=1))
    return ctx.step("end", record_call, ctx.run_id, "end")


@workflow("sched_declared", version=1, schedules=[
    schedule("declared-nightly", cron="0 2 * * *", timezone="Europe/Berlin", input={"report": "settlement"},
             business_key="settlement-{fire_time:%Y-%m-%d}", catch_up="all", catch_up_window=timedelta(hours=6)),
])
def sched_declared(ctx: Context, spec: dict) -> str:
    return ctx.step("settle", record_call, ctx.run_id, "settle")
