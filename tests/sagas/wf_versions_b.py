"""'versioned' v1 edited in place without bumping the version: the hash differs from A's."""

from __future__ import annotations

from sagas import Context, workflow
from tests.sagas.wf_engine import record_call


@workflow("versioned", version=1)
def versioned(ctx: Context, spec: dict) -> str:
    ctx.step("one", record_call, ctx.run_id, "one")
    ctx.step("two", record_call, ctx.run_id, "two")
    return "finished on B"
