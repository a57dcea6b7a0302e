"""A workflow's pause: hold every run of a workflow (or of one version), new runs too, and
lift it (``sagas.pausing``; as on the console's versions page). Only keys whose user sees
every tenant may set or lift one: it holds every tenant's runs. The workflow is named in the
body (or the query), not the path: a workflow's name may hold any character."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Query, Router, Schema

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import Text, console_action
from api.routes.runs import actor_of
from operators import roles
from operators.selectors.tenancy import may_see
from operators.services.runs import workflow_pause_act, workflow_resume_act
from sagas.errors import InvalidArgument, WorkflowNotRegistered
from sagas.integration import definition_for, replay_check, runs_to_check
from sagas.models import WorkflowPause

router = Router(tags=["workflows"])


class PauseIn(Schema):
    workflow: Text = Field(..., min_length=1, max_length=200)
    reason: Text = Field(..., min_length=1, max_length=4000, description="goes into the audit log")
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="one version; empty: every version")
    expected: str = Field("", max_length=40, description="what you saw (required): `running` to pause, `paused` to "
                                                         "resume; a pause set or lifted meanwhile is a 409")


class PauseOut(Schema):
    workflow: str
    version: int | None
    reason: str
    paused_by: str
    since: datetime


class PauseDone(Schema):
    message: str
    pauses: list[PauseOut]


def _pauses(name: str) -> list[dict[str, Any]]:
    pauses = WorkflowPause.objects.order_by("workflow_name", "version")
    if name:
        pauses = pauses.filter(workflow_name=name)
    return [{"workflow": p.workflow_name, "version": p.version, "reason": p.reason, "paused_by": p.paused_by_label,
             "since": p.created_at} for p in pauses]


class CheckIn(Schema):
    workflow: Text = Field(..., min_length=1, max_length=200)
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="the registered code to check against; "
                                                                      "empty: the newest")
    runs_of_version: int | None = Field(None, ge=1, le=2**31 - 1, description="only the runs of this version")
    sample: int = Field(100, ge=0, le=1000, description="recently finished runs to check besides those in flight")


class CheckedRunOut(Schema):
    run_id: str
    status: str
    outcome: str = Field(..., description="compatible, diverges or error")
    position: int | None = Field(None, description="the journal's seq where it diverged (or the last one replayed)")
    journal: dict[str, str | int] | None = Field(None, description="what the journal holds there: seq, kind, name")
    code_asked: dict[str, str] | None = Field(None, description="what the code asked for there: kind, name")
    source: dict[str, str | int] | None = Field(None, description="file, line and text in the workflow's code")
    message: str
    ended: str = Field(..., description="how a compatible replay ended: journal end, returned, waits, raised ...")


class CheckOut(Schema):
    workflow: str
    version: int
    definition_hash: str
    module: str
    counts: dict[str, int]
    seconds: float
    runs: list[CheckedRunOut]


@router.post("/replay-check", response=CheckOut, summary="Would this code resume these runs? (executes nothing)")
def check_workflow(request: ApiRequest, body: CheckIn) -> dict[str, Any]:
    """Replays the runs in flight (and a sample of recently finished ones) against a version of
    the workflow's code registered in the web process, executing and writing nothing; each run
    is ``compatible``, ``diverges`` (position, both sides, source line) or ``error``. Runs
    outside the key's tenants are not looked at."""
    if not roles.can_view(request.user):
        raise Problem("forbidden", "a role is needed to check runs")
    try:
        definition = definition_for(body.workflow, body.version)
    except WorkflowNotRegistered as exc:
        raise Problem("not-found", str(exc)) from None  # a well-formed name this process does not know
    except InvalidArgument as exc:
        raise Problem("validation", str(exc)) from None
    runs = [run for run in runs_to_check(body.workflow, version=body.runs_of_version, sample=body.sample)
            if may_see(request.user, run.tenant)]
    return replay_check(definition, runs).as_dict()


class PausesQuery(Schema):
    workflow: str = Field("", max_length=200, description="one workflow; empty: every pause")


@router.get("/pauses", response=list[PauseOut], summary="The pauses holding workflows' runs")
def workflow_pauses(request: ApiRequest, query: Query[PausesQuery]) -> list[dict[str, Any]]:
    return _pauses(query.workflow)


@router.post("/pause", response=PauseDone, summary="Pause every run of a workflow (or of one version)")
def pause_workflow(request: ApiRequest, body: PauseIn) -> dict[str, Any]:
    """Runs being advanced stop at their next step boundary; new runs wait too."""
    with console_action("workflow", body.workflow):
        workflow_pause_act(actor_of(request), name=body.workflow, version=body.version, reason=body.reason,
                           expected=body.expected.strip() or None)
    return {"message": "paused", "pauses": _pauses(body.workflow)}


@router.post("/resume", response=PauseDone, summary="Lift a workflow's pause")
def resume_workflow(request: ApiRequest, body: PauseIn) -> dict[str, Any]:
    """Lifts the pause set with the same ``version``; its runs are queued again."""
    with console_action("workflow", body.workflow):
        queued = workflow_resume_act(actor_of(request), name=body.workflow, version=body.version,
                                     reason=body.reason, expected=body.expected.strip() or None)
    return {"message": f"resumed; {queued} run(s) queued again", "pauses": _pauses(body.workflow)}
