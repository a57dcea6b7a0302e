"""``fix_order``, as a team would ship it: version 1 captures the card and then trips over a
bug (an order field that does not exist), so its runs fail with the card captured; version 2 is
the fix (the same capture, then the confirmation email)."""

from __future__ import annotations

from sagas import Context, workflow


@workflow("fix_order", version=1, on_failure="park")
def fix_order_v1(ctx: Context, order: dict) -> dict:
    charge = ctx.effect("capture", "payments.capture",
                        {"order": order["id"], "amount_cents": order["amount_cents"], "currency": "EUR"})
    return {"transaction_id": charge["transaction_id"], "loyalty": order["loyalty_tier"]}  # the bug


@workflow("fix_order", version=2, on_failure="park")
def fix_order_v2(ctx: Context, order: dict) -> dict:
    charge = ctx.effect("capture", "payments.capture",
                        {"order": order["id"], "amount_cents": order["amount_cents"], "currency": "EUR"})
    mail = ctx.effect("email", "email.send",
                      {"to": f"{order['id']}@example.com", "subject": f"Order {order['id']}", "body": "Thanks!"})
    return {"transaction_id": charge["transaction_id"], "message_id": mail["message_id"],
            "loyalty": order.get("loyalty_tier", "none")}


def quote(order: dict) -> int:
    return order["amount_cents"]


@workflow("fork_order", version=1)
def fork_order(ctx: Context, order: dict) -> dict:
    amount = ctx.step("quote", quote, order)
    charge = ctx.effect("capture", "payments.capture", {"order": order["id"], "amount_cents": amount,
                                                        "currency": "EUR"})
    ctx.step("pack", lambda: "packed")
    mail = ctx.effect("email", "email.send", {"to": f"{order['id']}@example.com", "subject": "Shipped", "body": "!"})
    return {"transaction_id": charge["transaction_id"], "message_id": mail["message_id"]}
