"""Test data of the runs list and a run's page: workflows and connectors of their own, runs in
the states the pages show, and helpers to read the pages and act on them."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

from django.db import connection
from django.test import Client
from django.urls import reverse

from ledger import Connector, connector
from operators.models import AuditEntry
from sagas import Context, start, workflow
from sagas.models import (
    RunStatus,
    WorkflowRun,
)
from sagas.replay.engine import advance

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
IMG_ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"
RUN_LINK = re.compile(r'href="/runs/([0-9a-f-]{36})/"')


@connector("rp.charge")
class Charge(Connector):
    def execute(self, payload, *, key):
        return {"transaction_id": f"tx-{payload['order']}", "card": "4111 1111 1111 1111"}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{payload['order']}"}


@connector("rp.ship")
class Ship(Connector):
    irreversible = True

    def execute(self, payload, *, key):
        return {"shipment_id": f"sh-{payload['order']}"}


@workflow("rp_plain", version=1)
def rp_plain(ctx: Context, spec: dict) -> dict:
    return spec


@workflow("rp_charge_ship_wait", version=1, approve_irreversible=False)
def rp_charge_ship_wait(ctx: Context, order: dict) -> dict:
    ctx.effect("charge", "rp.charge", {"order": order["id"], "amount_cents": 500})
    ctx.effect("ship", "rp.ship", {"order": order["id"]})
    ctx.approval("go_on", reason=f"Go on with order {order['id']}?", timeout=timedelta(hours=1))
    return {"done": True}


def _noop(i: int) -> int:
    return i


@workflow("rp_budget", version=1, max_steps=1)
def rp_budget(ctx: Context, spec: dict) -> list:
    return [ctx.step("s", _noop, i) for i in range(3)]


def text(response) -> str:
    return response.content.decode()


def listed(response) -> list[str]:
    """Run ids in the runs table, in page order."""
    assert response.status_code == 200
    return RUN_LINK.findall(text(response))


def waiting_run(order: str = "o-1", **options) -> WorkflowRun:
    """A WAITING run with two SUCCEEDED effects (charge, then the irreversible ship) and a
    PENDING approval."""
    run = start("rp_charge_ship_wait", {"id": order}, business_key=order, **options)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    return run


def parked_run() -> WorkflowRun:
    run = start("rp_budget", {})
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "budget_exceeded")
    return run


def set_created(run: WorkflowRun, at: datetime) -> None:
    WorkflowRun.objects.filter(id=run.id).update(created_at=at)


def append_entries(run: WorkflowRun, count: int, payload: dict | None = None) -> None:
    """Append ``count`` journal entries after the run's last one, in one INSERT."""
    run.refresh_from_db()
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
               SELECT %s, %s + n, 'step', 'tick#' || n, %s::jsonb || jsonb_build_object('i', n), 'w:1', now()
                 FROM generate_series(1, %s) AS n""",
            [run.id, run.last_seq, json.dumps(payload or {}), count],
        )
    WorkflowRun.objects.filter(id=run.id).update(last_seq=run.last_seq + count)
    run.refresh_from_db()


def run_url(run: WorkflowRun, name: str = "console:run") -> str:
    return reverse(name, args=[run.id])


def act(client: Client, run: WorkflowRun, name: str, *, expected: str | None = None, **data) -> object:
    form = {"reason": "customer asked on ticket 4411", "expected": run.status if expected is None else expected}
    form.update(data)
    return client.post(reverse(f"console:run_{name}", args=[run.id]), form)


def audits(run: WorkflowRun, action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(object_type="run", object_id=str(run.id), action=action))
