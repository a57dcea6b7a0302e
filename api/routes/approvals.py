"""Approvals: list the open ones, decide one (four-eyes and ``expected`` as in the console)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Query, Router, Schema

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import INT_CURSOR, MAX_PAGE, Text, console_action, int_id_of, next_link, one_of, parse_cursor
from api.routes.runs import RunOut, actor_of, run_out
from operators.selectors.paging import keyset_page
from operators.selectors.queues import approvals_open
from operators.selectors.tenancy import scope
from operators.services.queues import approval_act
from sagas.models import OPEN_APPROVAL_STATES, ApprovalRequest, ApprovalState, WorkflowRun

router = Router(tags=["approvals"])
STATES = tuple(ApprovalState.values)


class ApprovalQuery(Schema):
    state: str = Field("", max_length=40, pattern=one_of(STATES),
                       description=f"one of {', '.join(STATES)}; default: the open ones "
                                   f"({', '.join(OPEN_APPROVAL_STATES)}) of waiting runs")
    cursor: str = Field("", max_length=100, pattern=INT_CURSOR)
    limit: int = Field(50, ge=1, le=MAX_PAGE)


class ApprovalOut(Schema):
    id: int
    run_id: str
    workflow: str
    business_key: str
    tenant: str
    step: str
    reason: str
    state: str
    requested_at: datetime
    deadline: datetime
    started_by: str = Field("", description="who started the run: they cannot decide it (four-eyes)")
    decided_by: str
    decided_at: datetime | None
    comment: str


class ApprovalList(Schema):
    items: list[ApprovalOut] = Field(..., description="soonest deadline first")
    cursor: str | None = None
    next: str | None = None


class DecideIn(Schema):
    approve: bool
    comment: Text = Field("", max_length=4000, description="required to reject (the run is compensated)")
    expected: str = Field("", max_length=40, description="the approval's state you saw (required), e.g. PENDING")


class Decided(Schema):
    approval: ApprovalOut
    run: RunOut


def approval_out(a: ApprovalRequest) -> dict[str, Any]:
    run = a.run
    return {"id": a.id, "run_id": str(a.run_id), "workflow": run.workflow_name, "business_key": run.business_key,
            "tenant": run.tenant, "step": a.step, "reason": a.reason, "state": a.state,
            "requested_at": a.requested_at, "deadline": a.deadline,
            "started_by": run.started_by.get_username() if run.started_by else "",
            "decided_by": a.decided_by_label, "decided_at": a.decided_at, "comment": a.comment}


@router.get("", response=ApprovalList, summary="Approvals of the key's tenants, a page at a time")
def list_approvals(request: ApiRequest, query: Query[ApprovalQuery]) -> dict[str, Any]:
    state = query.state.strip().upper()
    if state and state not in STATES:
        raise Problem("validation", f"state must be one of {', '.join(STATES)}")
    if not state or state in OPEN_APPROVAL_STATES:
        qs = approvals_open(user=request.user)
        if state:
            qs = qs.filter(state=state)
    else:
        qs = (scope(ApprovalRequest.objects.filter(state=state), request.user, field="run__tenant")
              .select_related("run", "run__started_by").defer("run__input", "run__result", "run__error"))
    page = keyset_page(qs, field="deadline", descending=False, cursor=parse_cursor(query.cursor, key=int),
                       size=query.limit)
    return {"items": [approval_out(a) for a in page.items], "cursor": page.next_cursor,
            "next": next_link(request, "cursor", page.next_cursor)}


@router.post("/{approval_id}/decide", response=Decided, summary="Approve or reject (four-eyes)")
def decide(request: ApiRequest, approval_id: str, body: DecideIn) -> dict[str, Any]:
    """The key that started the run cannot decide it (409 ``four-eyes``). A rejection needs a
    ``comment``. ``expected``: the state you saw; a decided one is a 409 ``stale-state``
    saying who decided and when."""
    pk = int_id_of(approval_id, "approval")
    with console_action("approval", pk):
        approval_act(actor_of(request), approval_id=pk, approve=body.approve, comment=body.comment,
                     expected=body.expected.strip().upper() or None)
    decided = ApprovalRequest.objects.select_related("run", "run__started_by").get(id=pk)
    return {"approval": approval_out(decided), "run": run_out(request, WorkflowRun.objects.get(id=decided.run_id))}
