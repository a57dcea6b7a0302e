"""Version 2 of ``rc_order``, not deployed, that would break runs in flight: a step renamed."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, workflow


def reserve(order: dict) -> str:
    return f"res-{order['id']}"


@workflow("rc_order", version=2)
def rc_order(ctx: Context, order: dict) -> dict:
    reservation = ctx.step("reserve", reserve, order)
    ctx.step("quote", lambda: 100)  # was "price"
    ctx.sleep(timedelta(hours=1))
    return {"reservation": reservation}
