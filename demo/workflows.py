"""Example workflows used by ``make demo`` and the README."""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta

from sagas import Context, workflow


def scripted_model(prompt: str) -> dict:
    """A stand-in for a model call: deterministic text, a little latency, a cost."""
    time.sleep(0.05)
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    return {"text": f"plan-{digest}", "tokens": 420}


@workflow("order_fulfilment", version=1, max_steps=50, summary=["id", "sku", "qty"])
def order_fulfilment(ctx: Context, order: dict) -> dict:
    plan = ctx.step("plan", scripted_model, f"fulfil order {order['id']}")
    checked = ctx.step("check_stock", lambda: {"sku": order.get("sku", "SKU-1"), "available": True})
    priced = ctx.step("price", lambda: {"amount_cents": 4999 * order.get("qty", 1)})
    when = ctx.now()
    token = ctx.uuid()
    summary = ctx.step("summarise", scripted_model, f"{plan['text']} {priced['amount_cents']}")
    return {
        "order": order["id"],
        "plan": plan["text"],
        "in_stock": checked["available"],
        "amount_cents": priced["amount_cents"],
        "summary": summary["text"],
        "decided_at": when.isoformat(),
        "token": str(token),
    }


# --- the product demo's order agent (``make demo``) ---------------------------------
#
# Version 2 (below) is a pydantic-ai agent run with sagas.agents (demo/agent.py). Version 1, a
# hand-written loop, stays registered with everything it uses, unchanged, for the runs started
# under it (one waiting for a shipment approval can wait for hours): a run resumes only on the
# hash it started with, and that hash covers this module except the other @workflow functions.
# So version 2 imports what it needs inside its body: an import up here would change version 1's
# hash, and order_fulfilment's, and strand their runs in flight.

# Version 1: what the scripted model "bills" per token, in usd (of the order of a small hosted model).
PRICE_IN, PRICE_OUT = 0.000002, 0.000008
# The tools the agent may call, in the order its script uses them; each is a ledgered effect.
AGENT_TOOLS = ("payments.capture", "inventory.reserve", "shipping.create", "email.send")
EFFECT_NAMES = {
    "payments.capture": "capture",
    "inventory.reserve": "reserve",
    "shipping.create": "ship",
    "email.send": "email",
}


def agent_turn(ctx: Context, order: dict, seen: list[str]) -> dict:
    """A stand-in for a tool-using model: deterministic, a little latency, billed per token.

    Given the tools already called (``seen``), it picks the next one of ``AGENT_TOOLS``
    or ``finish``. It reports its cost with ``ctx.add_cost`` (charged once: on replay
    the journaled decision is returned and nothing is billed again).
    """
    time.sleep(0.03)
    tokens_in, tokens_out = 350 + 120 * len(seen), 40
    ctx.add_cost(round(tokens_in * PRICE_IN + tokens_out * PRICE_OUT, 6))
    upcoming = [tool for tool in AGENT_TOOLS if tool not in seen]
    if not upcoming:
        return {"action": "finish", "tokens": tokens_in + tokens_out,
                "thought": f"order {order['id']} is paid, reserved, shipped and confirmed"}
    thoughts = {
        "payments.capture": f"charge {order['amount_cents'] / 100:.2f} {order['currency']} before anything else",
        "inventory.reserve": f"reserve {order['qty']} x {order['sku']}",
        "shipping.create": f"ship to {order['address']['city']}: irreversible, needs a human's approval",
        "email.send": f"tell {order['email']} the parcel is on its way",
    }
    return {"action": upcoming[0], "tokens": tokens_in + tokens_out, "thought": thoughts[upcoming[0]]}


def _tool_payload(tool: str, order: dict, results: dict[str, dict]) -> dict:
    """The effect's payload, built from the order and earlier results only (deterministic on replay)."""
    if tool == "payments.capture":
        return {"order": order["id"], "amount_cents": order["amount_cents"], "currency": order["currency"]}
    if tool == "inventory.reserve":
        return {"sku": order["sku"], "qty": order["qty"]}
    if tool == "shipping.create":
        return {"order": order["id"], "address": order["address"]}
    shipment = results.get("shipping.create", {}).get("shipment_id", "?")
    return {"to": order["email"], "subject": f"Order {order['id']} has shipped",
            "body": f"Your order {order['id']} is on its way (shipment {shipment})."}


def order_summary(order: dict) -> dict:
    """What a person deciding about an order needs to see: which order, whose, how much, where to."""
    return {"order": order["id"], "customer": order["customer"],
            "amount": f"{order['amount_cents'] / 100:.2f} {order['currency']}", "ship_to": order["address"]["city"]}


@workflow("order_agent", version=1, max_steps=40, max_cost=0.5, approve_irreversible=False, summary=order_summary)
def order_agent(ctx: Context, order: dict) -> dict:
    """An agent fulfils an order: a scripted model picks each tool, every tool call is a
    ledgered effect, and the irreversible shipment waits for a person's approval."""
    results: dict[str, dict] = {}
    for _turn in range(len(AGENT_TOOLS) + 2):
        decision = ctx.step("think", agent_turn, ctx, order, list(results))
        tool = decision["action"]
        if tool == "finish":
            return {"order": order["id"], "summary": decision["thought"],
                    "charge": results["payments.capture"]["transaction_id"],
                    "shipment": results["shipping.create"]["shipment_id"]}
        if tool == "shipping.create":
            ctx.approval("ship", reason=f"Irreversible: ship order {order['id']} to {order['address']['city']}",
                         timeout=timedelta(hours=4), on_timeout="escalate")
        results[tool] = ctx.effect(EFFECT_NAMES[tool], tool, _tool_payload(tool, order, results))
    raise RuntimeError(f"the agent did not finish order {order['id']} within {len(AGENT_TOOLS) + 2} turns")


@workflow("order_agent", version=2, max_steps=40, max_cost=0.5, summary=order_summary)
def order_agent_v2(ctx: Context, order: dict) -> dict:
    """A pydantic-ai agent fulfils the order (``demo.agent``): each model turn is a journaled
    step billed once at the demo's gateway, each tool with a side effect a ledgered effect, and
    the irreversible shipment waits for ``approve:ship_order`` in the inbox. An order the agent
    did not ship (a rejected shipment, a refused reservation) fails the run, which compensates."""
    from demo.agent import AGENT_NAME, OrderNotShipped, make_order_agent, order_prompt
    from sagas.agents import run_agent

    report = run_agent(ctx, make_order_agent(), order_prompt(order), name=AGENT_NAME)
    if not report.shipped:
        raise OrderNotShipped(report.summary)
    return {"order": order["id"], "summary": report.summary, "charge": report.charge, "shipment": report.shipment}
