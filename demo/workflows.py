"""Example workflows used by ``make demo`` and the README."""

from __future__ import annotations

import hashlib
import time

from sagas import Context, workflow


def scripted_model(prompt: str) -> dict:
    """A stand-in for a model call: deterministic text, a little latency, a cost."""
    time.sleep(0.05)
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    return {"text": f"plan-{digest}", "tokens": 420}


@workflow("order_fulfilment", version=1, max_steps=50)
def order_fulfilment(ctx: Context, order: dict) -> dict:
    plan = ctx.step("plan", scripted_model, f"fulfil order {order['id']}")
    checked = ctx.step("check_stock", lambda: {"sku": order.get("sku", "SKU-1"), "available": True})
    priced = ctx.step("price", lambda: {"amount_cents": 4999 * order.get("qty", 1)})
    when = ctx.now()
    token = ctx.uuid()
    summary = ctx.step("summarise", scripted_model, f"{plan['text']} {priced['amount_cents']}")
    return {
        "order": order["id"],
        "plan": plan["text"],
        "in_stock": checked["available"],
        "amount_cents": priced["amount_cents"],
        "summary": summary["text"],
        "decided_at": when.isoformat(),
        "token": str(token),
    }
