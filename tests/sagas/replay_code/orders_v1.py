"""Version 1 of ``rc_order`` as deployed: two steps, a timer, then the bug (the tax is computed
from a key the input does not have), so runs fail after the timer."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, workflow


def reserve(order: dict) -> str:
    return f"res-{order['id']}"


@workflow("rc_order", version=1)
def rc_order(ctx: Context, order: dict) -> dict:
    reservation = ctx.step("reserve", reserve, order)
    ctx.step("price", lambda: 100)
    ctx.sleep(timedelta(hours=1))
    tax = order["tax_rate"] * 100  # the bug: no order has a tax_rate
    return {"reservation": reservation, "tax": tax}
