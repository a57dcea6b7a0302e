"""Workflows for the saga, approval, timer, signal and cancellation tests."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, workflow
from tests.sagas.wf_engine import record_call


def _capture(ctx: Context, name: str, order: str, cents: int) -> dict:
    return ctx.effect(name, "payments.capture", {"order": order, "amount_cents": cents, "currency": "EUR"})


@workflow("three_then_fail", version=1)
def three_then_fail(ctx: Context, order: dict) -> dict:
    _capture(ctx, "capture", order["id"], 1000)
    ctx.effect("reserve", "inventory.reserve", {"sku": "SKU-9", "qty": 2})
    _capture(ctx, "capture2", order["id"] + "-extra", 250)
    ctx.effect("notify", "email.send", {"to": "ops@example.com", "subject": order["id"], "body": "4th"})
    return {"unreachable": True}


@workflow("approve_then_ship", version=1, approve_irreversible=False)
def approve_then_ship(ctx: Context, order: dict) -> dict:
    charge = _capture(ctx, "capture", order["id"], 4999)
    decision = ctx.approval(
        "ship", reason=f"Irreversible: ship order {order['id']}",
        timeout=timedelta(seconds=order.get("timeout", 3600)), on_timeout=order.get("on_timeout", "escalate"),
    )
    shipment = ctx.effect("ship", "shipping.create", {"order": order["id"], "address": "1 Main St"})
    return {"charge": charge["transaction_id"], "shipment": shipment["shipment_id"], "approved_by": decision["by"]}


@workflow("ship_gated", version=1)
def ship_gated(ctx: Context, order: dict) -> dict:
    shipment = ctx.effect("ship", "shipping.create", {"order": order["id"], "address": "2 Side St"})
    return {"shipment": shipment["shipment_id"]}


@workflow("nap", version=1)
def nap(ctx: Context, spec: dict) -> dict:
    ctx.step("before", record_call, ctx.run_id, "before")
    ctx.sleep(timedelta(seconds=spec["seconds"]))
    ctx.step("after", record_call, ctx.run_id, "after")
    return {"slept": spec["seconds"]}


@workflow("await_payment", version=1)
def await_payment(ctx: Context, spec: dict) -> dict:
    from sagas.errors import WaitTimedOut

    try:
        got = ctx.wait_for("payment_confirmed", timeout=timedelta(seconds=spec["timeout"]))
    except WaitTimedOut:
        return {"confirmed": False}
    return {"confirmed": True, "payload": got}


@workflow("capture_then_wait", version=1)
def capture_then_wait(ctx: Context, order: dict) -> dict:
    _capture(ctx, "capture", order["id"], 700)
    ctx.approval("go", reason="continue?", timeout=timedelta(hours=1))
    return {"done": True}


@workflow("long_steps", version=1)
def long_steps(ctx: Context, spec: dict) -> int:
    for i in range(spec["steps"]):
        ctx.step("tick", record_call, ctx.run_id, f"tick{i}", 0.0, None, spec.get("pause", 0.0))
    return spec["steps"]
