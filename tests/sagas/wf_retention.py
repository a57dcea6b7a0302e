"""Workflows and connectors of the retention tests: an order with a charge (a custom key, so a
later run can repeat it), an approval, a failure that compensates, and a short retention."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection

from ledger import Connector, connector
from sagas import Context, workflow


def charges(key: str) -> int:
    """How many times the provider really executed ``key`` (survives the archive)."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS test_retention_charges (key text, at timestamptz DEFAULT now())")
        cur.execute("SELECT count(*) FROM test_retention_charges WHERE key = %s", [key])
        return cur.fetchone()[0]


@connector("ret.charge")
class Charge(Connector):
    def execute(self, payload, *, key):
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS test_retention_charges (key text, at timestamptz DEFAULT now())")
            cur.execute("INSERT INTO test_retention_charges (key) VALUES (%s)", [key])
        return {"transaction_id": f"tx-{key}", "amount_cents": payload["amount_cents"]}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{key}"}


def _note(text: str) -> str:
    return text


@workflow("ret_order", version=1, approve_irreversible=False)
def ret_order(ctx: Context, order: dict) -> dict:
    ctx.step("note", _note, order.get("note", "plain"))
    charge = ctx.effect("charge", "ret.charge", {"order": order["id"], "amount_cents": order.get("cents", 500)},
                        key=f"charge-{order['id']}")
    if order.get("approve"):
        ctx.approval("go_on", reason=f"Go on with order {order['id']}?", timeout=timedelta(hours=1))
    if order.get("fail"):
        raise RuntimeError(f"order {order['id']} failed after its charge")
    return {"charge": charge}


@workflow("ret_short", version=1, retention=timedelta(days=7))
def ret_short(ctx: Context, spec: dict) -> dict:
    ctx.step("note", _note, "short")
    return spec


@workflow("ret_quick", version=1)
def ret_quick(ctx: Context, spec: dict) -> dict:
    return {"noted": ctx.step("note", _note, spec.get("note", "quick"))}
