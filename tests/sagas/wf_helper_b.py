"""'helper_edited' v1. wf_helper_a.py and wf_helper_b.py differ only in the body of _discount,
a helper in the workflow's own module: the hash must tell them apart."""

from __future__ import annotations

from sagas import Context, workflow
from tests.sagas.wf_engine import record_call


def _discount(cents: int) -> int:
    return round(cents * 0.8)


@workflow("helper_edited", version=1)
def helper_edited(ctx: Context, spec: dict) -> int:
    ctx.step("price", record_call, ctx.run_id, "price")
    return _discount(spec["cents"])
