"""The workflow of ``bench/continue_loop.py`` (registered through SAGAS_MODULES=bench.loop_workflows)."""

from __future__ import annotations

from typing import Any

from sagas import Context, workflow


def _turn(i: int) -> dict[str, Any]:
    """One agent turn with a scripted model: no network, so the figure is the engine's own."""
    return {"turn": i, "reply": f"scripted reply {i}"}


@workflow("bench_loop", version=1)
def bench_loop(ctx: Context, state: dict) -> dict:
    """``state``: i (turns done), end, every. One step per turn; continues as new every ``every``."""
    i, end, every = state["i"], state["end"], state["every"]
    stop = min(end, i + every)
    while i < stop:
        ctx.step("turn", _turn, i)
        i += 1
    if i >= end:
        return {"turns": i}
    return ctx.continue_as_new({"i": i, "end": end, "every": every})
