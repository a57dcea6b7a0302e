"""Workflows for the continue-as-new tests. Worker processes load them with SAGAS_MODULES."""

from __future__ import annotations

from sagas import Context, workflow
from tests.sagas.wf_engine import record_call


def _turn(ctx: Context, label: str, i: int, cost: float, pause: float) -> str:
    if cost:
        ctx.add_cost(cost)
    return record_call(label, f"turn{i}", 0.0, None, pause)


@workflow("cont_loop", version=1)
def cont_loop(ctx: Context, state: dict) -> dict:
    """``state``: label (where turns are counted), i (turns done), end, every, cost, pause.
    Continues as new every ``every`` turns until ``end`` turns are done."""
    i = state.get("i", 0)
    for _ in range(state["every"]):
        if i >= state["end"]:
            return {"turns": i, "run": ctx.run_id}
        ctx.step("turn", _turn, ctx, state["label"], i, state.get("cost", 0.0), state.get("pause", 0.0))
        i += 1
    if i >= state["end"]:
        return {"turns": i, "run": ctx.run_id}
    return ctx.continue_as_new({**state, "i": i})


@workflow("cont_bad_state", version=1)
def cont_bad_state(ctx: Context, state: dict) -> None:
    ctx.step("before", record_call, ctx.run_id, "before")
    ctx.continue_as_new({"seen": {1, 2, 3}})  # a set is not JSON


@workflow("cont_signal", version=1)
def cont_signal(ctx: Context, state: dict) -> dict:
    """Continues as new once, then waits in the second run for the signal ``go``."""
    if state.get("n", 0) == 0:
        return ctx.continue_as_new({"n": 1})
    from datetime import timedelta

    return {"got": ctx.wait_for("go", timeout=timedelta(hours=1))}
