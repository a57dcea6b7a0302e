"""The workflows of ``bench/children.py`` (registered through SAGAS_MODULES=bench.children_workflows)."""

from __future__ import annotations

from sagas import Context, workflow

# A Redis counter per parent run, +1 each time a worker executes the parent's function (its
# first execution and every replay, under every claim): what waiting for the children cost
# in replays, which the run's ``attempts`` (claims) does not show when a claim replays more
# than once (a child's end journaled while the parent ran: it replays instead of suspending).
EXECUTIONS_KEY = "bench:children:executions:{run_id}"


def _double(i: int) -> int:
    return i * 2


@workflow("bench_child", version=1)
def bench_child(ctx: Context, item: dict) -> int:
    """One trivial step: a child, or (the baseline) a plain top-level run of the same shape."""
    return ctx.step("work", _double, item["i"])


@workflow("bench_fan_out", version=1)
def bench_fan_out(ctx: Context, spec: dict) -> dict:
    """Starts ``spec['n']`` children ``bench_child`` one after another, then gathers them all."""
    from sagas.runtime.queue import redis_connection

    # Outside any step on purpose: a measurement, not part of the run (replays agree without it).
    redis_connection().incr(EXECUTIONS_KEY.format(run_id=ctx.run_id))
    handles = [ctx.start_child("bench_child", {"i": i}) for i in range(spec["n"])]
    results = ctx.gather(handles)
    return {"children": len(results), "sum": sum(results)}
