"""Every console action x every role (and anonymous): who may, who may not, and the audit trail."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from ledger.models import ConnectorFlow, EffectRecord, EffectStatus, SpendLimit
from operators import roles
from operators.models import AuditEntry
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    JournalEntry,
    RunStatus,
    Schedule,
    ScheduleTick,
    WorkflowPause,
    WorkflowRun,
)
from sagas.versions import registry
from tests.sagas import wf_repair  # noqa: F401  (rm_order version 2, the move's target, in this process)

pytestmark = pytest.mark.django_db

# Who may do what, written out by hand rather than read from operators.roles, so that a wrong
# roles table fails here. Anonymous visitors are sent to the login page for every action.
ALLOWED, DENIED = "allowed", "denied"
ROLE_USERS = ("viewer", "operator", "approver", "superuser")
EXPECTED = {
    #                    viewer   operator  approver  superuser
    "effect.query":     (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "effect.resolve":   (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "approval.approve": (DENIED,  DENIED,   ALLOWED,  ALLOWED),
    "approval.reject":  (DENIED,  DENIED,   ALLOWED,  ALLOWED),
    "run.cancel":       (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.retry":        (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.compensate":   (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.pause":        (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.resume":       (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.move":         (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.redrive":      (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "run.fork":         (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "workflow.pause":   (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "workflow.resume":  (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "connector.pause":  (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "connector.resume": (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "connector.limits": (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "connector.spend_limit": (DENIED, ALLOWED, DENIED,  ALLOWED),
    "schedule.create":  (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "schedule.pause":   (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "schedule.resume":  (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "schedule.trigger": (DENIED,  ALLOWED,  DENIED,   ALLOWED),
    "schedule.backfill": (DENIED, ALLOWED,  DENIED,   ALLOWED),
    "schedule.delete":  (DENIED,  ALLOWED,  DENIED,   ALLOWED),
}
MATRIX = [(action, who, outcome) for action, row in EXPECTED.items() for who, outcome in zip(ROLE_USERS, row)]


def _run(status: str, reason: str = "", **extra) -> WorkflowRun:
    fields = {"workflow_name": "matrix", "version": 1, "definition_hash": "0" * 64, "input": {}, **extra}
    return WorkflowRun.objects.create(status=status, status_reason=reason, last_seq=0, **fields)


def _schedule(*, paused: bool = False) -> Schedule:
    tick = timezone.now() + timedelta(hours=1)
    return Schedule.objects.create(
        name=f"matrix-{uuid.uuid4().hex[:6]}", workflow_name="rm_order", input={"id": "s"}, cron="0 * * * *",
        business_key="{schedule}@{fire_time_utc}", jitter=timedelta(0), catch_up="last",
        catch_up_window=timedelta(hours=1), overlap="allow_all", source="api", paused=paused, next_tick_at=tick,
        due_at=tick)


def _schedule_target(action: str) -> tuple[str, dict, callable]:
    if action == "schedule.create":
        return ("/schedules/", {"name": "made-here", "workflow": "rm_order", "cron": "0 * * * *", "input": '{"id": "c"}',
                                "overlap": "allow_all", "reason": "new report"},
                lambda: Schedule.objects.filter(name="made-here").exists())
    s = _schedule(paused=action == "schedule.resume")
    url = f"/schedules/{s.name}/{action.split('.')[1]}/"
    if action == "schedule.trigger":
        return url, {"reason": "now"}, lambda: ScheduleTick.objects.filter(schedule=s, how="trigger").exists()
    if action == "schedule.backfill":
        return (url, {"start": "2026-01-01 00:00", "end": "2026-01-01 02:00", "reason": "missed"},
                lambda: ScheduleTick.objects.filter(schedule=s, how="backfill").count() == 3)
    if action == "schedule.delete":
        return url, {"reason": "gone", "expected": "active"}, lambda: not Schedule.objects.filter(id=s.id).exists()
    expected = "paused" if action == "schedule.resume" else "active"
    return (url, {"reason": "why", "expected": expected},
            lambda: Schedule.objects.get(id=s.id).paused == (action == "schedule.pause"))


def _target(action: str, settings) -> tuple[str, dict, callable]:
    """(url, form, did_it_happen) for a fresh object on which ``action`` can succeed."""
    settings.DEMO_PROVIDERS_URL = "http://127.0.0.1:9"  # nothing listens: the lookup says Unknown
    if action.startswith("effect."):
        run = _run(RunStatus.NEEDS_ATTENTION, "effect_unknown", error={"code": "effect_unknown"})
        effect = EffectRecord.objects.create(
            tenant="default", idempotency_key=f"{run.id}:capture", run_id=run.id, step_name="capture",
            connector="payments.capture", request_payload={"order": "o"}, payload_hash="h" * 64,
            status=EffectStatus.UNKNOWN, intent_at=timezone.now(), attempts=1,
        )
        if action == "effect.query":
            return (f"/effects/{effect.id}/query/", {},
                    lambda: AuditEntry.objects.filter(action="effect.query", outcome="ok").exists())
        return (f"/effects/{effect.id}/resolve/",
                {"outcome": "succeeded", "downstream_ref": "txn-77", "note": "seen in the dashboard",
                 "expected": "UNKNOWN"},
                lambda: EffectRecord.objects.get(id=effect.id).status == EffectStatus.SUCCEEDED)
    if action.startswith("schedule."):
        return _schedule_target(action)
    if action.startswith("approval."):
        run = _run(RunStatus.WAITING)
        approval = ApprovalRequest.objects.create(
            run=run, step="ship", reason="ship it", requested_at=timezone.now(),
            deadline=timezone.now() + timezone.timedelta(hours=1),
        )
        approve = action == "approval.approve"
        return (f"/approvals/{approval.id}/decide/",
                {"decision": "approve" if approve else "reject", "comment": "checked", "expected": "PENDING",
                 "confirm": "compensate"},
                lambda: ApprovalRequest.objects.get(id=approval.id).state
                == (ApprovalState.APPROVED if approve else ApprovalState.REJECTED))
    if action == "run.cancel":
        run = _run(RunStatus.PENDING)
        return (f"/runs/{run.id}/cancel/", {"reason": "duplicate", "expected": "PENDING"},
                lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.CANCELLED)
    if action == "run.retry":
        run = _run(RunStatus.NEEDS_ATTENTION, "budget_exceeded", max_steps=5, steps_used=5,
                   error={"code": "budget_exceeded", "budget": "steps", "used": 5, "limit": 5})
        return (f"/runs/{run.id}/retry/", {"reason": "raise the budget", "expected": "NEEDS_ATTENTION"},
                lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.PENDING)
    if action == "run.pause":
        run = _run(RunStatus.PENDING)
        return (f"/runs/{run.id}/pause/", {"reason": "investigating", "expected": "PENDING"},
                lambda: WorkflowRun.objects.get(id=run.id).paused_at is not None)
    if action == "run.resume":
        run = _run(RunStatus.PENDING, paused_at=timezone.now())
        return (f"/runs/{run.id}/resume/", {"reason": "done", "expected": "PENDING"},
                lambda: WorkflowRun.objects.get(id=run.id).paused_at is None)
    if action == "run.move":  # a run parked because no worker has its code, moved to code that replays it
        run = _run(RunStatus.NEEDS_ATTENTION, "version_mismatch", workflow_name="rm_order", input={"id": "m"})
        return (f"/runs/{run.id}/move/", {"reason": "fix", "expected": "NEEDS_ATTENTION", "version": "2"},
                lambda: WorkflowRun.objects.get(id=run.id).version == 2)
    if action == "run.redrive":
        run = _run(RunStatus.FAILED, "workflow_error", workflow_name="rm_order", input={"id": "r"})
        return (f"/runs/{run.id}/redrive/", {"reason": "fix", "expected": "FAILED", "version": ""},
                lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.PENDING)
    if action == "run.fork":  # re-run from the first step of a run of rm_order v2 whose history is one step
        run = _run(RunStatus.WAITING, workflow_name="rm_order", version=2, input={"id": "f"},
                   definition_hash=registry.find("rm_order", 2).definition_hash)
        JournalEntry.objects.create(run=run, seq=1, kind="step", name="reserve", payload={"value": "x"},
                                    created_at=timezone.now())
        return (f"/runs/{run.id}/fork/", {"reason": "again", "expected": "WAITING", "version": "", "at": "1"},
                lambda: WorkflowRun.objects.filter(forked_from=run.id).exists())
    if action == "workflow.pause":
        _run(RunStatus.PENDING)
        return ("/versions/pause/", {"workflow": "matrix", "reason": "incident", "version": "", "expected": "running"},
                lambda: WorkflowPause.objects.filter(workflow_name="matrix").exists())
    if action == "workflow.resume":
        _run(RunStatus.PENDING)
        WorkflowPause.objects.create(workflow_name="matrix", reason="incident", paused_by_label="someone")
        return ("/versions/resume/", {"workflow": "matrix", "reason": "over", "version": "", "expected": "paused"},
                lambda: not WorkflowPause.objects.filter(workflow_name="matrix").exists())
    if action == "connector.spend_limit":  # the connectors page's spend-limit form posts to the page
        return ("/connectors/", {"tenant": "acme", "connector": "model", "per_day": "5", "reason": "budget",
                                 "expected": "none"},
                lambda: SpendLimit.objects.filter(tenant="acme", connector="model", per_day=5).exists())
    if action.startswith("connector."):
        flow = ConnectorFlow.objects.create(connector="matrix.send", burst=1, declared={},
                                            paused_at=timezone.now() if action == "connector.resume" else None)
        if action == "connector.pause":
            return ("/connectors/pause/", {"connector": "matrix.send", "reason": "incident", "expected": "running"},
                    lambda: ConnectorFlow.objects.get(connector="matrix.send").paused_at is not None)
        if action == "connector.resume":
            return ("/connectors/resume/", {"connector": "matrix.send", "reason": "over", "expected": "paused"},
                    lambda: ConnectorFlow.objects.get(connector="matrix.send").paused_at is None)
        limits = {"rate": "2", "burst": "2", "max_in_flight": "", "key_field": "", "circuit_failures": "5",
                  "circuit_window_seconds": "60", "circuit_cooldown_seconds": "30"}
        return ("/connectors/limits/", {"connector": flow.connector, "reason": "slow down", "expected": "running",
                                        **limits},
                lambda: ConnectorFlow.objects.get(connector="matrix.send").rate == 2.0)
    run = _run(RunStatus.NEEDS_ATTENTION, "budget_exceeded")
    return (f"/runs/{run.id}/compensate/", {"reason": "customer refund", "expected": "NEEDS_ATTENTION"},
            lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPENSATING)


def _login(client, who: str):
    roles.ensure_groups()
    model = get_user_model()
    if who == "superuser":
        user = model.objects.create_superuser(f"su-{uuid.uuid4().hex[:6]}", password="pw")
    else:
        user = model.objects.create_user(f"{who}-{uuid.uuid4().hex[:6]}", password="pw")
        user.groups.add(Group.objects.get(name=who))
    client.force_login(user)
    return user


@pytest.mark.parametrize(("action", "who", "expected"), MATRIX)
def test_it_allows_each_action_only_to_its_role_and_audits_every_attempt(client, settings, action, who, expected):
    url, form, happened = _target(action, settings)
    user = _login(client, who)
    response = client.post(url, form)

    entry = AuditEntry.objects.get(actor=user)
    assert entry.action == action
    if expected == ALLOWED:
        assert response.status_code in (200, 302), response.content[:500]
        assert happened(), f"{who} was allowed to {action} but nothing changed"
        assert entry.outcome == "ok"
    else:
        assert response.status_code == 403
        assert not happened(), f"{who} must not {action}"
        assert entry.outcome == "denied" and entry.before is None


@pytest.mark.parametrize("action", list(EXPECTED))
def test_it_sends_an_anonymous_visitor_to_the_login_page_for_every_action(client, settings, action):
    url, form, happened = _target(action, settings)
    response = client.post(url, form)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert not happened() and AuditEntry.objects.count() == 0


# Actions only the HTTP API offers (the console has no button for them): tests/api/test_roles_matrix.py.
API_ONLY = {"run.start", "run.signal"}


def test_it_checks_every_action_the_roles_table_knows():
    assert set(EXPECTED) == set(roles.ACTION_ROLES) - API_ONLY


def test_it_refuses_a_post_without_csrf(settings):
    from django.test import Client

    url, form, happened = _target("run.cancel", settings)
    client = Client(enforce_csrf_checks=True)
    _login(client, "operator")
    assert client.post(url, form).status_code == 403
    assert not happened()
