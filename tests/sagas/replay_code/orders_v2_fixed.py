"""Version 2 of ``rc_order``, not deployed: the same history, and the tax computed with a default."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, workflow


def reserve(order: dict) -> str:
    return f"res-{order['id']}"


@workflow("rc_order", version=2)
def rc_order(ctx: Context, order: dict) -> dict:
    reservation = ctx.step("reserve", reserve, order)
    ctx.step("price", lambda: 100)
    ctx.sleep(timedelta(hours=1))
    tax = ctx.step("tax", lambda: order.get("tax_rate", 0.2) * 100)
    return {"reservation": reservation, "tax": tax}
