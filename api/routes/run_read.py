"""Reading one run, and waiting for it to finish (``GET /runs/{id}?wait=N``)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from ninja import Query, Router, Schema
from pydantic import Field

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.runs import RunOut, run_out
from api.waiting import MAX_WAIT_S, run_wait

router = Router(tags=["runs"])

WAIT_DESCRIPTION = f"""The run as it is now; with `?wait=N` (0 < N <= {MAX_WAIT_S:g} seconds) a long-poll: if the run
is not settled, the answer comes when it settles or after N seconds, whichever is first, with the run
as it is then (check `status`: still `RUNNING` or `PENDING` means the wait timed out; ask again).

A run is settled when it is finished (`COMPLETED`, `FAILED`, `CANCELLED`, `COMPENSATED`) **or when
it needs a person**: `NEEDS_ATTENTION` (see `attention_reason`), or `WAITING` on an open approval.
A program waiting "for the run to finish" gets control back then, to alert someone or decide the
approval, instead of blocking until its timeout. A run `WAITING` on a timer or a signal resumes by
itself, so the wait goes on. The wait is woken by the database's notification of the change (no
polling); answering takes well under 100 ms after the change commits."""


class WaitQuery(Schema):
    wait: float | None = Field(None, gt=0, le=MAX_WAIT_S, description="seconds to wait for the run to settle")


@router.get("/{run_id}", response=RunOut, summary="A run as it is now, or once it settles (?wait=)",
            description=WAIT_DESCRIPTION)
async def get_run(request: ApiRequest, run_id: str, query: Query[WaitQuery]) -> dict[str, Any]:
    if query.wait is None:
        from operators.selectors.runs import run_get

        run = await sync_to_async(run_get)(run_id, user=request.user)
    else:
        run = await run_wait(run_id, user=request.user, timeout=query.wait)
    if run is None:
        raise Problem("not-found", f"no run {run_id[:100]!r} (or not in this key's tenants)")
    return await sync_to_async(run_out)(request, run)
