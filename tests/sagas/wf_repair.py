"""Workflows for the repair tests (``sagas.move`` / ``redrive``), every version deployed.

``rm_order``: version 1 has a bug after its timer (a key no order has); version 2 is the fix,
with the same history; version 3 renamed a step, so runs of version 1 do not replay on it.
``rm_flaky``: a step that fails while ``BROKEN`` holds, as a provider that changed its answer."""

from __future__ import annotations

from datetime import timedelta

from sagas import Context, workflow

calls: list[str] = []
BROKEN = {"charge": True}


def counted(label: str) -> str:
    calls.append(label)
    return f"{label}-done"


@workflow("rm_order", version=1, on_failure="park")
def rm_order_v1(ctx: Context, order: dict) -> dict:
    ctx.step("reserve", counted, "reserve")
    ctx.sleep(timedelta(hours=1))
    return {"tax": order["tax_rate"] * 100}  # the bug


@workflow("rm_order", version=2, on_failure="park")
def rm_order_v2(ctx: Context, order: dict) -> dict:
    ctx.step("reserve", counted, "reserve")
    ctx.sleep(timedelta(hours=1))
    return {"tax": ctx.step("tax", lambda: order.get("tax_rate", 0.2) * 100)}


@workflow("rm_order", version=3, on_failure="park")
def rm_order_v3(ctx: Context, order: dict) -> dict:
    ctx.step("reserve_stock", counted, "reserve")  # renamed
    ctx.sleep(timedelta(hours=1))
    return {}


def charge() -> str:
    calls.append("charge")
    if BROKEN["charge"]:
        raise RuntimeError("card processor says: try again later")
    return "charged"


@workflow("rm_flaky", version=1, on_failure="park")
def rm_flaky(ctx: Context, order: dict) -> dict:
    ctx.step("reserve", counted, "reserve")
    return {"charge": ctx.step("charge", charge), "after": ctx.step("after", counted, "after")}
