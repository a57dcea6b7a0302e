"""The deployment before version 3 existed: only 'multi' v2."""

from __future__ import annotations

from sagas import Context, workflow
from tests.sagas.wf_engine import record_call


@workflow("multi", version=2)
def multi_v2(ctx: Context, spec: dict) -> str:
    ctx.step("fetch", record_call, ctx.run_id, "fetch")
    ctx.step("decide", record_call, ctx.run_id, "decide")
    return "v2"
