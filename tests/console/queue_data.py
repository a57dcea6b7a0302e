"""Test data of the queue pages (ambiguous effects, approvals), the versions page and the audit
log: a workflow and two connectors of their own, and small factories."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger import Connector, connector
from ledger.models import EffectRecord, EffectStatus
from ledger.outcomes import Unknown
from operators.models import AuditEntry, AuditOutcome
from sagas import Context, workflow
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    RunStatus,
    WorkflowRun,
)

HOSTILE = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@workflow("qp_ship", version=1)
def qp_ship(ctx: Context, order: dict) -> str:
    ctx.approval("ship", reason=f"Irreversible: ship order {order['id']}", timeout=timedelta(hours=4))
    return "shipped"


@connector("qp.lookup")
class LookupConnector(Connector):
    answer = Unknown("the provider is unsure")

    def execute(self, payload, *, key):  # pragma: no cover - never dispatched in these tests
        raise AssertionError("the console must not dispatch effects")

    def lookup(self, key):
        return type(self).answer


@connector("qp.blind")
class BlindConnector(Connector):
    def execute(self, payload, *, key):  # pragma: no cover
        raise AssertionError("the console must not dispatch effects")


def make_run(*, status=RunStatus.NEEDS_ATTENTION, reason="effect_unknown", name="qp_orders", version=1,
             definition_hash="a" * 64, started_by=None, **fields) -> WorkflowRun:
    return WorkflowRun.objects.create(
        workflow_name=name, version=version, definition_hash=definition_hash, status=status,
        status_reason=reason, started_by=started_by, **fields,
    )


def make_effect(*, run=None, status=EffectStatus.UNKNOWN, age=timedelta(minutes=5), connector="qp.blind",
                step="capture", **fields) -> EffectRecord:
    run = run or make_run()
    now = timezone.now()
    values = {
        "tenant": "default", "idempotency_key": f"{step}-{uuid.uuid4()}", "run_id": run.id, "step_name": step,
        "connector": connector, "request_payload": {"order": "o-1", "amount_cents": 4999},
        "payload_hash": "0" * 64, "status": status, "intent_at": now - age, "dispatched_at": now - age,
        "attempts": 1, "error_class": "Timeout", "error_message": "no answer within 2.0 s",
    }
    values.update(fields)
    return EffectRecord.objects.create(**values)


def make_approval(*, run=None, step="ship", deadline_in=timedelta(hours=2), state=ApprovalState.PENDING,
                  reason="Irreversible: ship goods", **fields) -> ApprovalRequest:
    run = run or make_run(status=RunStatus.WAITING, reason="")
    now = timezone.now()
    return ApprovalRequest.objects.create(
        run=run, step=step, reason=reason, requested_at=now - timedelta(minutes=1), deadline=now + deadline_in,
        state=state, **fields,
    )


def resolve(client: Client, effect: EffectRecord, *, expected: str | None = "UNKNOWN", **data):
    form = {"outcome": "succeeded", "downstream_ref": "ch_123", "note": "provider dashboard shows ch_123 captured"}
    form.update(data)
    if expected is not None:
        form["expected"] = expected
    return client.post(reverse("console:effect_resolve", args=[effect.id]), form)


def audit(**fields) -> AuditEntry:
    values = {"actor_label": "olga", "action": "effect.resolve", "object_type": "effect", "object_id": "1",
              "outcome": AuditOutcome.OK}
    values.update(fields)
    return AuditEntry.objects.create(**values)


def text(response) -> str:
    return response.content.decode()
