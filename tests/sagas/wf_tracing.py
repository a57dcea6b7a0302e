"""Workflows and a connector for the tracing tests (``tests/sagas/test_tracing.py``). Worker
processes load them with SAGAS_MODULES."""

from __future__ import annotations

from ledger import Connector, connector
from sagas import Context, workflow
from sagas.integration import trace_headers
from tests.sagas.wf_engine import record_call

sent: list[dict] = []  # what the connector below had to send with each call, in this process


@connector("tracing_tests.pay")
class Pay(Connector):
    """Records the trace headers it would send; the provider dedupes by key."""

    idempotent = True
    compensation_idempotent = True

    def execute(self, payload, *, key):
        sent.append({"call": "pay", **trace_headers()})
        return {"id": f"txn-{key}"}

    def compensate(self, payload, result, *, key):
        sent.append({"call": "refund", **trace_headers()})
        return {"id": f"refund-{key}"}


def quote() -> int:
    return 42


def out_of_stock() -> None:
    raise ValueError("out of stock")


@workflow("traced_order", version=1)
def traced_order(ctx: Context, order: dict) -> str:
    ctx.step("quote", quote)
    ctx.effect("pay", "tracing_tests.pay", {"order": order["id"]})
    ctx.step("ship", quote)
    return "shipped"


@workflow("traced_refund", version=1)
def traced_refund(ctx: Context, order: dict) -> str:
    ctx.effect("pay", "tracing_tests.pay", {"order": order["id"]})
    ctx.step("pack", out_of_stock)  # fails: the payment is compensated
    return "packed"


@workflow("traced_checkout", version=1)
def traced_checkout(ctx: Context, order: dict) -> str:
    """On real workers against the demo's payment provider; ``slow`` holds the first s2."""
    ctx.step("s1", record_call, ctx.run_id, "s1")
    ctx.effect("charge", "payments.capture", {"order": order["id"], "amount_cents": 4999, "currency": "EUR"})
    ctx.step("s2", record_call, ctx.run_id, "s2", order.get("slow", 0.0))
    ctx.step("s3", record_call, ctx.run_id, "s3")
    return "done"
