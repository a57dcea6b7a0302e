"""Workflows for the child-run tests. Worker processes load them with SAGAS_MODULES."""

from __future__ import annotations

from datetime import timedelta

from sagas import ChildFailed, Context, workflow
from tests.sagas.wf_engine import record_call


@workflow("fan_out", version=1)
def fan_out(ctx: Context, spec: dict) -> dict:
    """Starts ``n`` children ``fan_child`` and gathers them; ``pause``: each child's step sleeps."""
    handles = [ctx.start_child("fan_child", {"i": i, "label": spec["label"], "pause": spec.get("pause", 0.0)})
               for i in range(spec["n"])]
    results = ctx.gather(handles)
    return {"children": len(results), "sum": sum(results)}


@workflow("fan_child", version=1)
def fan_child(ctx: Context, item: dict) -> int:
    ctx.step("work", record_call, item["label"], f"child{item['i']}", 0.0, None, item.get("pause", 0.0))
    return item["i"] * 2


@workflow("order_tree", version=1)
def order_tree(ctx: Context, order: dict) -> dict:
    """Captures the payment, ships each parcel as its own child run one after another, then a
    last child that fails when ``order["fail_last"]``: the parent compensates the tree."""
    charge = ctx.effect("capture", "payments.capture",
                        {"order": order["id"], "amount_cents": order["amount_cents"], "currency": "EUR"})
    shipped = []
    for sku in order["parcels"]:
        shipped.append(ctx.wait_child(ctx.start_child("parcel", {"order": order["id"], "sku": sku})))
    ctx.wait_child(ctx.start_child("parcel_check", {"fail": order.get("fail_last", False)}))
    return {"transaction_id": charge["transaction_id"], "parcels": shipped}


@workflow("parcel", version=1)
def parcel(ctx: Context, item: dict) -> str:
    reserved = ctx.effect("reserve", "inventory.reserve", {"sku": item["sku"], "qty": 1})
    return reserved["reservation_id"]


def _check(fail: bool) -> str:
    if fail:
        raise RuntimeError("the carrier refused the last parcel")
    return "ok"


@workflow("parcel_check", version=1)
def parcel_check(ctx: Context, item: dict) -> str:
    return ctx.step("check", _check, item["fail"])


@workflow("waiting_tree", version=1)
def waiting_tree(ctx: Context, spec: dict) -> dict:
    """Reserves stock, then starts children that each reserve and wait for a signal ``go``
    (``spec["detached"]``: one more child, detached); gathers them."""
    ctx.effect("reserve", "inventory.reserve", {"sku": "parent", "qty": 1})
    handles = [ctx.start_child("waiting_child", {"sku": f"kid{i}"}) for i in range(spec["n"])]
    if spec.get("detached"):
        ctx.start_child("waiting_child", {"sku": "free"}, detached=True)
    if spec.get("signal"):
        for h in handles:
            ctx.signal_child(h, "go", {"from": "parent"})
    return {"got": ctx.gather(handles)}


@workflow("waiting_child", version=1)
def waiting_child(ctx: Context, item: dict) -> dict:
    ctx.effect("reserve", "inventory.reserve", {"sku": item["sku"], "qty": 1})
    return {"signal": ctx.wait_for("go", timeout=timedelta(hours=1))}


@workflow("catching_parent", version=1)
def catching_parent(ctx: Context, spec: dict) -> dict:
    """Catches its child's failure and reports it: the error reaches the parent."""
    try:
        ctx.wait_child(ctx.start_child("parcel_check", {"fail": True}))
    except ChildFailed as exc:
        return {"caught": exc.as_dict()}
    return {"caught": None}


@workflow("budget_parent", version=1)
def budget_parent(ctx: Context, spec: dict) -> dict:
    """Children that spend: the parent's max_cost covers them."""
    for i in range(spec["children"]):
        ctx.wait_child(ctx.start_child("spender", {"cost": spec["cost"], "label": spec["label"], "i": i}))
    return {"done": True}


def _spend(ctx: Context, cost: float, label: str, i: int) -> str:
    ctx.add_cost(cost)
    return record_call(label, f"spend{i}")


@workflow("spender", version=1)
def spender(ctx: Context, item: dict) -> str:
    return ctx.step("spend", _spend, ctx, item["cost"], item["label"], item["i"])


def _look_up(i: int) -> int:
    import time

    time.sleep(0.02)  # a lookup per item before its child starts: the parent is mid-fan-out for ~2 s
    return i


@workflow("fan_out_paced", version=1)
def fan_out_paced(ctx: Context, spec: dict) -> dict:
    handles = []
    for i in range(spec["n"]):
        ctx.step("look_up", _look_up, i)
        handles.append(ctx.start_child("fan_child", {"i": i, "label": spec["label"]}))
    results = ctx.gather(handles)
    return {"children": len(results), "sum": sum(results)}


@workflow("keyed_parent", version=1)
def keyed_parent(ctx: Context, spec: dict) -> dict:
    """Starts a child under a business key someone else's run already has."""
    return {"got": ctx.wait_child(ctx.start_child("fan_child", {"i": 1, "label": "X"}, business_key=spec["key"]))}


@workflow("bad_gather", version=1)
def bad_gather(ctx: Context, spec: dict) -> list:
    return ctx.gather(["not a handle"])


@workflow("returns_early", version=1)
def returns_early(ctx: Context, spec: dict) -> str:
    """Starts two children that wait for a signal, one detached, and returns without waiting."""
    ctx.start_child("waiting_child", {"sku": "attached"})
    ctx.start_child("waiting_child", {"sku": "detached"}, detached=True)
    return "done"


@workflow("chain_child", version=1)
def chain_child(ctx: Context, state: dict) -> str:
    """Continues as new once; the second run of its chain returns."""
    if not state.get("again"):
        return ctx.continue_as_new({"again": True})
    return "end of chain"


@workflow("two_children", version=1)
def two_children(ctx: Context, spec: dict) -> dict:
    """A child (which continues as new), a step, then another child: a re-run from the step reuses
    the first child and starts a second of its own."""
    first = ctx.wait_child(ctx.start_child("chain_child", {}))
    ctx.step("middle", record_call, spec["label"], "middle")
    second = ctx.wait_child(ctx.start_child("fan_child", {"i": 5, "label": spec["label"]}))
    return {"first": first, "second": second}
