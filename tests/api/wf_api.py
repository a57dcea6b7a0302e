"""Workflows for the API tests. Worker processes load them with SAGAS_MODULES (tests/api/conftest.py)."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, workflow


@workflow("api_payment", version=1)
def api_payment(ctx: Context, order: dict) -> dict:
    """Waits for the payment provider's ``payment_settled`` callback (a signed webhook) and
    returns what it said."""
    settled = ctx.wait_for("payment_settled", timeout=timedelta(hours=1))
    return {"order": order.get("id"), "settled": settled}
