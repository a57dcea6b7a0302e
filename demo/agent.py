"""The product demo's order agent: a pydantic-ai ``Agent`` run durably with ``sagas.agents``.

Its model is scripted (``FunctionModel``; no LLM, no network but the demo's own gateway): each
turn reads the conversation so far, as a real model would, and asks for the next tool:

====  =====================================  ==================================================
turn  asks for                               what it is
====  =====================================  ==================================================
1     ``look_up_product(sku)``               a plain tool: read-only, journaled as a step
2     ``capture_payment(...)``               ``payments.capture``, a ledgered effect
3     ``reserve_stock(sku, qty)``            ``inventory.reserve``, a ledgered effect
4     ``ship_order(order, street, city)``    ``shipping.create``: irreversible, so the run first
                                             waits for ``approve:ship_order`` in the inbox
5     ``send_email(to, subject, body)``      ``email.send``, a ledgered effect
6     the ``OrderReport`` (final output)     shipped, with the charge and the shipment
====  =====================================  ==================================================

A tool result saying ``rejected`` (a person said no to the shipment) or ``failed`` (a
provider refused for good) ends the script early with ``shipped=False``; the workflow then
fails and compensates (refund, release), as version 1 did.

Each turn is billed at the demo's model gateway (``model.complete``), at the price
``sagas.agents.model_cost`` charges the run for it, under the turn's ``Idempotency-Key``
(``<run id>:order:turn-<n>``, from ``model_settings["extra_headers"]``). A worker killed
after the gateway answered and before the turn was journaled repeats the turn with the same
key, and the gateway answers it from its cache without a second bill: its books
(``ProviderExecution`` rows of ``model.complete``) match the runs' ``cost_used``. Without the
key every repeat would be billed again. The bill is retried with that key while the gateway
cannot be reached (about 10 s), since a repeat is free; after that the turn fails, as a model
outage would.

Token counts are an estimate from the text exchanged (4 characters a token), deterministic
for a given conversation.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from demo import client
from ledger import Retryable, Timeout
from sagas.agents import effect_tool, model_cost

MODEL_NAME = "demo-order-model"  # priced in SAGAS_MODEL_PRICES (config/settings.py)
AGENT_NAME = "order"  # run_agent's name: journal entries "order.model", "order.tool.look_up_product"
ORDER_MARKER = "Order (JSON): "
GATEWAY_ATTEMPTS = 6  # bills tried with one key: waits 0.25, 0.5, 1, 2, 4 s between them
LATENCY_S = 0.03  # what a turn takes besides the gateway, so a run is watchable in the console

INSTRUCTIONS = (
    "You fulfil a web shop's orders. Look the product up, capture the payment, reserve the stock, "
    "ship the order (a person approves each shipment) and email the customer, in that order. "
    "If a step is rejected or fails, stop and report the order as not shipped, saying why."
)

# The demo's catalogue: what look_up_product reads (demo.loadgen's SKUs).
CATALOGUE: dict[str, dict[str, Any]] = {
    "SKU-KETTLE": {"name": "Kettle, 1.7 l", "warehouse": "Leeds", "weight_g": 1200},
    "SKU-LAMP": {"name": "Desk lamp", "warehouse": "Leeds", "weight_g": 900},
    "SKU-CHAIR": {"name": "Folding chair", "warehouse": "Utrecht", "weight_g": 4800},
    "SKU-BOOK": {"name": "A Discipline of Programming", "warehouse": "Utrecht", "weight_g": 450},
    "SKU-MUG": {"name": "Mug", "warehouse": "Leeds", "weight_g": 350},
}


class OrderReport(BaseModel):
    """The agent's final answer."""

    shipped: bool
    summary: str
    charge: str | None = None
    shipment: str | None = None


class OrderNotShipped(Exception):
    """The agent stopped without shipping; raised by the workflow so the run compensates."""


# --- the tools ------------------------------------------------------------------------


def look_up_product(sku: str) -> dict[str, Any]:
    """Read the catalogue entry of a SKU: its name, warehouse and weight (read-only)."""
    entry = CATALOGUE.get(sku)
    return {"sku": sku, "known": False} if entry is None else {"sku": sku, "known": True, **entry}


@effect_tool("payments.capture")
def capture_payment(order: str, amount_cents: int, currency: str) -> dict[str, Any]:
    """Capture the order's payment, in cents of the currency."""
    return {"order": order, "amount_cents": amount_cents, "currency": currency}


@effect_tool("inventory.reserve")
def reserve_stock(sku: str, qty: int) -> dict[str, Any]:
    """Reserve qty units of the SKU for the order."""
    return {"sku": sku, "qty": qty}


@effect_tool("shipping.create")
def ship_order(order: str, street: str, city: str) -> dict[str, Any]:
    """Create the order's shipment to the address. Irreversible: a person approves it first."""
    return {"order": order, "address": {"street": street, "city": city}}


@effect_tool("email.send")
def send_email(to: str, subject: str, body: str) -> dict[str, Any]:
    """Send the customer an email."""
    return {"to": to, "subject": subject, "body": body}


# --- the scripted model -----------------------------------------------------------------


def order_prompt(order: dict) -> str:
    """The user prompt the workflow sends: the order, which the model reads back from it."""
    return f"Fulfil order {order['id']} for {order['customer']}.\n{ORDER_MARKER}{json.dumps(order, sort_keys=True)}"


def _order_of(messages: list[ModelMessage]) -> dict:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str) and ORDER_MARKER in part.content:
                    return json.loads(part.content.split(ORDER_MARKER, 1)[1])
    raise ValueError(f"no {ORDER_MARKER!r} line in the conversation")


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    """The latest result of each tool called so far, by tool name."""
    return {part.tool_name: part.content for message in messages if isinstance(message, ModelRequest)
            for part in message.parts if isinstance(part, ToolReturnPart)}


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _conversation_text(messages: list[ModelMessage], info: AgentInfo) -> str:
    """What a model would read this turn: instructions, prompts, tool calls and results."""
    texts = [info.instructions or ""]
    for message in messages:
        for part in message.parts:
            if isinstance(part, (SystemPromptPart, UserPromptPart, ToolReturnPart)):
                texts.append(part.content if isinstance(part.content, str) else json.dumps(part.content, default=str))
            elif isinstance(part, ToolCallPart):
                texts.append(part.tool_name + part.args_as_json_str())
            elif hasattr(part, "content") and isinstance(part.content, str):
                texts.append(part.content)
    texts.extend(json.dumps(t.parameters_json_schema) for t in info.function_tools)
    return "\n".join(texts)


def _next(order: dict, done: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The next tool call (name, args), or ("final", report) once there is nothing left to do."""
    for tool, result in done.items():
        if isinstance(result, dict) and result.get("status") in ("rejected", "failed"):
            return "final", {"shipped": False, "summary": f"Order {order['id']} was not shipped: {tool} "
                             f"{result['status']}: {result.get('message', '')}",
                             "charge": (done.get("capture_payment") or {}).get("transaction_id")}
    if "look_up_product" not in done:
        return "look_up_product", {"sku": order["sku"]}
    if "capture_payment" not in done:
        return "capture_payment", {"order": order["id"], "amount_cents": order["amount_cents"],
                                   "currency": order["currency"]}
    if "reserve_stock" not in done:
        return "reserve_stock", {"sku": order["sku"], "qty": order["qty"]}
    if "ship_order" not in done:
        return "ship_order", {"order": order["id"], "street": order["address"]["street"],
                              "city": order["address"]["city"]}
    shipment = done["ship_order"]["shipment_id"]
    if "send_email" not in done:
        product = done["look_up_product"].get("name", order["sku"])
        return "send_email", {"to": order["email"], "subject": f"Order {order['id']} has shipped",
                              "body": f"Dear {order['customer']}, your {product} (x{order['qty']}) is on its "
                                      f"way to {order['address']['city']}: shipment {shipment}."}
    return "final", {"shipped": True, "charge": done["capture_payment"]["transaction_id"], "shipment": shipment,
                     "summary": f"Order {order['id']} is paid, reserved, shipped ({shipment}) and confirmed "
                                f"to {order['email']}."}


def bill(*, key: str, prompt: str, price: float) -> dict[str, Any]:
    """One completion billed at the demo's model gateway under ``key``; retried with the same key
    while the gateway cannot be reached or answers unclearly (a repeat is never billed twice)."""
    delay = 0.25
    for attempt in range(1, GATEWAY_ATTEMPTS + 1):
        try:
            return client.call("POST", "/model/complete", {"prompt": prompt, "price": price}, key=key)
        except (Retryable, Timeout, client.UnexpectedResponse, OSError):
            if attempt == GATEWAY_ATTEMPTS:
                raise
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One model turn, deterministic from the conversation: the next tool call, or the report."""
    order = _order_of(messages)
    done = _returns(messages)
    action, args = _next(order, done)
    turn = 1 + sum(isinstance(m, ModelResponse) for m in messages)
    if action == "final":
        part = ToolCallPart(info.output_tools[0].name, args, tool_call_id=f"call-{turn}")
    else:
        part = ToolCallPart(action, args, tool_call_id=f"call-{turn}")
    usage = RequestUsage(input_tokens=_tokens(_conversation_text(messages, info)),
                         output_tokens=_tokens(part.tool_name + part.args_as_json_str()))
    time.sleep(LATENCY_S)
    key = ((info.model_settings or {}).get("extra_headers") or {}).get("Idempotency-Key", "")
    price, priced = model_cost(MODEL_NAME, usage.input_tokens, usage.output_tokens)
    if key and priced and price > 0:
        bill(key=key, prompt=f"order {order['id']}, turn {turn}: {action}", price=price)
    return ModelResponse(parts=[part], usage=usage, model_name=MODEL_NAME)


def make_order_agent() -> Agent[None, OrderReport]:
    """The demo's order agent: the scripted model, four effect tools and one plain read tool."""
    return Agent(
        FunctionModel(script, model_name=MODEL_NAME), name="order_agent", output_type=OrderReport,
        instructions=INSTRUCTIONS,
        tools=[look_up_product, capture_payment, reserve_stock, ship_order, send_email],
    )
