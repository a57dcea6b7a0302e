"""Runs: start, read, list, history, signal, cancel, compensate, retry, wait."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.http import HttpRequest
from django.urls import reverse
from ninja import Field, Router, Schema, Status

from api.auth import actor_ip
from api.errors import Problem
from console import roles
from console.services.actions import Actor, audit_denied, audit_done
from sagas.errors import InvalidArgument, NotSerializable, StartConflict, WorkflowNotRegistered
from sagas.models import WorkflowRun

router = Router(tags=["runs"])


class Budget(Schema):
    max_steps: int | None = Field(None, ge=1)
    max_cost: float | None = Field(None, ge=0)
    max_duration_s: float | None = Field(None, gt=0)


class StartIn(Schema):
    workflow: str = Field(..., min_length=1, max_length=200)
    version: int | None = Field(None, ge=1)
    input: Any = None
    business_key: str = Field("", max_length=200)
    tenant: str = Field("default", min_length=1, max_length=100)
    budget: Budget | None = None


class RunOut(Schema):
    id: str
    workflow: str
    version: int
    status: str
    attention_reason: str = Field("", description="why it waits for a person (NEEDS_ATTENTION), or why it failed")
    business_key: str
    tenant: str
    input: Any
    result: Any = None
    error: Any = None
    steps_used: int
    cost_used: float
    max_steps: int | None
    max_cost: float | None
    created_at: datetime
    finished_at: datetime | None
    console_url: str


def actor_of(request: HttpRequest) -> Actor:
    return Actor(user=request.user, ip=actor_ip(request), system=f"api key {request.auth.name}")


def run_out(request: HttpRequest, run: WorkflowRun) -> dict[str, Any]:
    return {
        "id": str(run.id), "workflow": run.workflow_name, "version": run.version, "status": run.status,
        "attention_reason": run.status_reason, "business_key": run.business_key, "tenant": run.tenant,
        "input": run.input, "result": run.result, "error": run.error, "steps_used": run.steps_used,
        "cost_used": float(run.cost_used), "max_steps": run.max_steps,
        "max_cost": float(run.max_cost) if run.max_cost is not None else None,
        "created_at": run.created_at, "finished_at": run.finished_at,
        "console_url": request.build_absolute_uri(reverse("console:run", args=[run.id])),
    }


def require(request: HttpRequest, action: str, object_type: str, object_id: Any, reason: str = "") -> Actor:
    """The caller's actor, if its role allows ``action``; else the attempt is audited and refused."""
    actor = actor_of(request)
    if not roles.can(request.user, action):
        audit_denied(actor, action, object_type, object_id, reason=reason)
        raise Problem("forbidden", f"key {request.auth.name} may not {action.replace('.', ' ')}: "
                                   f"it needs the {roles.ACTION_ROLES[action]} role")
    return actor


@router.post("", response={200: RunOut, 201: RunOut}, summary="Start a run (idempotent per business key)")
def start_run(request: HttpRequest, body: StartIn) -> Status:
    """Start ``workflow``. The ``Idempotency-Key`` header is the business key (it wins over
    ``business_key``): the same key and input again answers the existing run with 200; the same
    key with another input is a 409 ``start-conflict`` and starts nothing."""
    from sagas import start

    key = request.headers.get("Idempotency-Key", "").strip()
    business_key = key or body.business_key
    actor = require(request, "run.start", "workflow", body.workflow, reason=business_key)
    budget = body.budget or Budget()
    try:
        with transaction.atomic():
            run = start(
                body.workflow, body.input, business_key=business_key, tenant=body.tenant, version=body.version,
                started_by=request.user, started_via="api", max_steps=budget.max_steps, max_cost=budget.max_cost,
                max_duration=timedelta(seconds=budget.max_duration_s) if budget.max_duration_s else None,
            )
            if run.created_now:
                audit_done(actor, "run.start", "run", run.id, reason=business_key,
                           after={"state": run.status, "workflow": run.workflow_name, "version": run.version},
                           tenant=run.tenant)
    except WorkflowNotRegistered as exc:
        raise Problem("unknown-workflow", str(exc)) from None
    except StartConflict as exc:
        raise Problem("start-conflict", str(exc)) from None
    except (InvalidArgument, NotSerializable) as exc:
        raise Problem("validation", str(exc)) from None
    return Status(201 if run.created_now else 200, run_out(request, run))
