"""Workflows for the infrastructure-fault tests (loaded by workers through SAGAS_MODULES).

Steps count their real executions by appending a line to the file named by
``FAULTS_CALLS`` (one ``<run_id> <step> <pid> <epoch seconds>`` line each): the file is outside
every server the tests restart, so the count survives them.
"""

from __future__ import annotations

import os
import time

from sagas import Context, workflow


def tick(run_id: str, step: str, pause: float = 0.0) -> str:
    """One counted execution of ``step``: record it, sleep ``pause``, return ``<step>-done``."""
    path = os.environ.get("FAULTS_CALLS")
    if path:
        with open(path, "a") as calls:  # O_APPEND: one short line per write, never interleaved
            calls.write(f"{run_id} {step} {os.getpid()} {time.time():.3f}\n")
    if pause:
        time.sleep(pause)
    return f"{step}-done"


@workflow("fault_order", version=1)
def fault_order(ctx: Context, order: dict) -> dict:
    """Three provider effects (payments dedupes by key; inventory and email do not) between
    steps that take ``pause`` seconds, so a run spans a server restart."""
    pause = order.get("pause", 0.3)
    ctx.step("prepare", tick, ctx.run_id, "prepare", pause)
    charge = ctx.effect(
        "capture", "payments.capture", {"order": order["id"], "amount_cents": 4999, "currency": "EUR"}
    )
    ctx.step("check", tick, ctx.run_id, "check", pause)
    reservation = ctx.effect("reserve", "inventory.reserve", {"sku": f"SKU-{order['id']}", "qty": 1})
    ctx.step("pack", tick, ctx.run_id, "pack", pause)
    mail = ctx.effect(
        "email", "email.send", {"to": f"{order['id']}@example.com", "subject": f"Order {order['id']}", "body": "ok"}
    )
    return {
        "transaction_id": charge["transaction_id"],
        "reservation_id": reservation["reservation_id"],
        "message_id": mail["message_id"],
    }


@workflow("ticks", version=1)
def ticks(ctx: Context, spec: dict) -> list:
    """``steps`` counted steps of ``pause`` seconds each."""
    return [ctx.step(f"t{i}", tick, ctx.run_id, f"t{i}", spec.get("pause", 0.0)) for i in range(spec["steps"])]


@workflow("swallow_step", version=1)
def swallow_step(ctx: Context, spec: dict) -> dict:
    """Catches everything around a slow step, as careless workflow code does. A storage
    error while the step's result is journaled must not land in this ``except``. If it
    does, the workflow lingers (a fallback that takes a while) and reports it swallowed."""
    try:
        value = ctx.step("slow", tick, ctx.run_id, "slow", spec["pause"])
    except Exception as exc:
        time.sleep(spec.get("linger", 0.0))
        return {"swallowed": True, "error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"swallowed": False, "value": value}


@workflow("swallow_effect", version=1)
def swallow_effect(ctx: Context, spec: dict) -> dict:
    """The same around an effect: the provider answers while the database is down, so the
    outcome's write is what fails."""
    try:
        mail = ctx.effect("email", "email.send", {"to": f"{spec['id']}@example.com", "subject": "s", "body": "b"})
    except Exception as exc:
        time.sleep(spec.get("linger", 0.0))
        return {"swallowed": True, "error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"swallowed": False, "message_id": mail["message_id"]}


@workflow("failover_order", version=1)
def failover_order(ctx: Context, order: dict) -> dict:
    """The lighter order of the failover load: a counted step, a capture (the provider dedupes
    by key) and an email (a connector with neither lookup nor idempotency: sent twice, it is
    delivered twice)."""
    ctx.step("prepare", tick, ctx.run_id, "prepare")
    charge = ctx.effect("capture", "payments.capture", {"order": order["id"], "amount_cents": 1250, "currency": "EUR"})
    mail = ctx.effect("email", "email.send", {"to": f"{order['id']}@example.com", "subject": "Paid", "body": "ok"})
    return {"transaction_id": charge["transaction_id"], "message_id": mail["message_id"]}


@workflow("gap_order", version=1)
def gap_order(ctx: Context, spec: dict) -> dict:
    """Steps of ``pause`` seconds around a capture and an email, then ``after`` more: long
    enough for a test to cut replication and fail over while the run is in the middle. The
    ``settle`` step (``settle`` seconds) after ``prepare`` leaves the test time to cut
    replication once ``prepare`` is on the standby, before the capture's intent is written."""
    pause = spec.get("pause", 0.3)
    ctx.step("prepare", tick, ctx.run_id, "prepare", pause)
    ctx.step("settle", tick, ctx.run_id, "settle", spec.get("settle", 1.0))  # the test cuts replication here
    charge = ctx.effect("capture", "payments.capture", {"order": spec["id"], "amount_cents": 990, "currency": "EUR"})
    ctx.step("check", tick, ctx.run_id, "check", pause)
    mail = ctx.effect("email", "email.send", {"to": f"{spec['id']}@example.com", "subject": "Paid", "body": "ok"})
    for i in range(spec.get("after", 10)):
        ctx.step(f"after{i}", tick, ctx.run_id, f"after{i}", pause)
    return {"transaction_id": charge["transaction_id"], "message_id": mail["message_id"]}
