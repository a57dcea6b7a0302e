"""The fault soak's order workflow (registered by SAGAS_MODULES=bench.faults_workflows).

Two model-like steps (``think``: a pause the input sets, then a decision) and three
ledgered effects through the demo connectors, against the real simulated providers
(``manage.py demo_providers``):

* ``capture``: ``payments.capture`` (idempotent, lookup; compensated by a refund),
* ``reserve``: ``inventory.reserve`` (lookup, not idempotent; compensated by a release),
* ``ship``: ``shipping.create`` (idempotent, lookup, irreversible).

The input decides two things per run, so the bench knows what each run should end as:

* ``approval``: the run waits for a person's approval before shipping (the bench
  approves it, as a user other than the one who started the run);
* ``undeliverable``: the order has no address, so the shipping provider refuses it
  (422, nothing executed), the effect fails for good, and the saga refunds the
  capture and releases the stock: the run ends COMPENSATED, by design.

Every other run ends COMPLETED. Each effect's idempotency key is the engine's
default, ``"<run id>:<step>"`` (a compensation's is ``"<effect key>:compensate"``),
and the providers record the key of every execution, so executions beyond one per
key are duplicates.
"""

from __future__ import annotations

import time
from datetime import timedelta

import demo.connectors  # noqa: F401  (registers payments.capture, inventory.reserve, shipping.create)
from sagas import Context, workflow


def think(order: dict, what: str) -> dict:
    """A stand-in for a model call: ``order["think"]`` / 2 seconds, then a decision. Only the
    first execution waits; a replay returns the journaled decision."""
    time.sleep(order["think"] / 2)
    if what == "price":
        return {"amount_cents": 1999 + 100 * order["qty"], "currency": "EUR"}
    return {"label": f"parcel for {order['id']}"}


# The shipment is irreversible; the engine's automatic gate would put an approval before
# every run's shipment. Only the runs that ask for one wait for a person here.
@workflow("faults_order", version=1, max_steps=50, approve_irreversible=False)
def faults_order(ctx: Context, order: dict) -> dict:
    quote = ctx.step("price", think, order, "price")
    charge = ctx.effect("capture", "payments.capture", {
        "order": order["id"], "amount_cents": quote["amount_cents"], "currency": quote["currency"],
    })
    stock = ctx.effect("reserve", "inventory.reserve", {"sku": order["sku"], "qty": order["qty"]})
    ctx.step("label", think, order, "label")
    if order["approval"]:
        ctx.approval("ship", reason=f"Ship order {order['id']}", timeout=timedelta(hours=1))
    shipment = ctx.effect("ship", "shipping.create", {"order": order["id"], "address": order["address"]})
    return {
        "order": order["id"], "charge": charge["transaction_id"], "reservation": stock["reservation_id"],
        "shipment": shipment["shipment_id"],
    }
