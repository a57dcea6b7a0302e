"""The deployment after version 3: v2 is kept, unchanged, so its runs finish on it."""

from __future__ import annotations

from sagas import Context, workflow
from tests.sagas.wf_engine import record_call


@workflow("multi", version=2)
def multi_v2(ctx: Context, spec: dict) -> str:
    ctx.step("fetch", record_call, ctx.run_id, "fetch")
    ctx.step("decide", record_call, ctx.run_id, "decide")
    return "v2"


@workflow("multi", version=3)
def multi_v3(ctx: Context, spec: dict) -> str:
    ctx.step("fetch", record_call, ctx.run_id, "fetch")
    ctx.step("score", record_call, ctx.run_id, "score")
    ctx.step("decide", record_call, ctx.run_id, "decide")
    return "v3"
