"""Order workflows for the ledger tests (loaded by workers through SAGAS_MODULES)."""

from __future__ import annotations

from sagas import Context, workflow


@workflow("order3", version=1)
def order3(ctx: Context, order: dict) -> dict:
    charge = ctx.effect(
        "capture", "payments.capture",
        {"order": order["id"], "amount_cents": order.get("amount_cents", 4999), "currency": "EUR"},
        key=order.get("capture_key"),
    )
    reservation = ctx.effect("reserve", "inventory.reserve", {"sku": order.get("sku", "SKU-1"), "qty": 1})
    mail = ctx.effect(
        "email", "email.send",
        {"to": f"{order['id']}@example.com", "subject": f"Order {order['id']}", "body": "Thanks!"},
    )
    return {
        "transaction_id": charge["transaction_id"],
        "reservation_id": reservation["reservation_id"],
        "message_id": mail["message_id"],
    }


@workflow("email_only", version=1)
def email_only(ctx: Context, order: dict) -> dict:
    mail = ctx.effect("email", "email.send", {"to": "ops@example.com", "subject": order["id"], "body": "hi"})
    return {"message_id": mail["message_id"]}


@workflow("capture_only", version=1)
def capture_only(ctx: Context, order: dict) -> dict:
    charge = ctx.effect(
        "capture", "payments.capture",
        {"order": order["id"], "amount_cents": order.get("amount_cents", 4999), "currency": "EUR"},
        key=order.get("capture_key"),
    )
    return {"transaction_id": charge["transaction_id"]}


@workflow("priced_calls", version=1)
def priced_calls(ctx: Context, order: dict) -> dict:
    """``calls`` billed completions of ``price`` each (the gateway caches answers by key)."""
    answers = [
        ctx.effect("complete", "model.complete", {"prompt": f"{order['id']} part {i}", "price": order["price"]})
        for i in range(order["calls"])
    ]
    return {"answers": len(answers)}
