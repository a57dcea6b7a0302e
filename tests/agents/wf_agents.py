"""An order agent for the agent tests (loaded by workers through SAGAS_MODULES).

The model is a pydantic-ai ``FunctionModel`` that plays a script given in the run's input,
one move per turn (tool calls, or a final text). Each turn is also a real request to the demo
model gateway (``/model/complete``) under the ``Idempotency-Key`` the integration puts in
``model_settings["extra_headers"]``, so the gateway's books count what was billed
(``ProviderExecution``) and what was answered from its cache (``ProviderReplay``). The prompt
sent is the newest request's parts (kind, tool, content) as canonical JSON, so the gateway's
books also hold what the model was given each turn; it carries no timestamps, so a repeated
turn sends the same body.

A script whose last move is a tool call never finishes: the model repeats that move forever.
Code changes that replay must refuse, made per worker by the environment (read at run time, so
the workflow's definition hash stays the same): ``AGENT_PLAIN_TOOLS`` (comma-separated tool
names) declares those effect tools as plain tools, ``AGENT_DROP_TOOLS`` leaves them out.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage
from pydantic_core import to_jsonable_python

from demo import client
from sagas import Context, workflow
from sagas.agents import effect_tool, run_agent

MODEL_NAME = "scripted-gateway"
# Tokens each turn reports; priced by SAGAS_MODEL_PRICES where a test sets it.
INPUT_TOKENS, OUTPUT_TOKENS = 1000, 500
# What the gateway bills per completion (its own books; not the run's budget).
GATEWAY_PRICE = 0.01


def received(message: ModelMessage) -> list[dict[str, Any]]:
    """What a request gave the model: each part's kind, tool and content."""
    return [
        {"kind": part.part_kind, "tool": getattr(part, "tool_name", None),
         "content": to_jsonable_python(getattr(part, "content", None))}
        for part in message.parts
    ]


def scripted_model(script: list[dict[str, Any]]) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = 1 + sum(isinstance(m, ModelResponse) for m in messages)
        key = ((info.model_settings or {}).get("extra_headers") or {}).get("Idempotency-Key", "")
        prompt = json.dumps({"turn": turn, "received": received(messages[-1])}, sort_keys=True)
        answer = client.call("POST", "/model/complete", {"prompt": prompt, "price": GATEWAY_PRICE}, key=key)
        move = script[min(turn, len(script)) - 1]
        usage = RequestUsage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS)
        if "text" in move:
            return ModelResponse(parts=[TextPart(f"{move['text']} [{answer['completion_id']}]")], usage=usage)
        calls = [
            ToolCallPart(call["tool"], call.get("args", {}), tool_call_id=f"call-{turn}-{i}")
            for i, call in enumerate(move["calls"])
        ]
        return ModelResponse(parts=calls, usage=usage)

    return FunctionModel(respond, model_name=MODEL_NAME)


@effect_tool("payments.capture")
def capture_payment(order: str, amount_cents: int) -> dict:
    """Capture the order's payment, in euro cents."""
    return {"order": order, "amount_cents": amount_cents, "currency": "EUR"}


@effect_tool("email.send")
def send_email(to: str, subject: str, body: str) -> dict:
    """Email the customer."""
    return {"to": to, "subject": subject, "body": body}


@effect_tool("shipping.create")
def ship_order(order: str, address: str) -> dict:
    """Create the shipment (cannot be cancelled)."""
    return {"order": order, "address": address}


def check_order(order: str) -> dict:
    """Read the order's status."""
    return {"order": order, "status": "open"}


def apply_discount(order: str, percent: int) -> dict:
    """Give the customer a discount on the order; a person approves it first."""
    return {"order": order, "discount_percent": percent, "status": "applied"}


def _names(variable: str) -> set[str]:
    return {name for name in os.environ.get(variable, "").split(",") if name}


def tools() -> list[Any]:
    plain, dropped = _names("AGENT_PLAIN_TOOLS"), _names("AGENT_DROP_TOOLS")
    effects = [t for t in (capture_payment, send_email, ship_order) if t.name not in dropped]
    return [
        *(Tool(t.function, name=t.name) if t.name in plain else t for t in effects),
        Tool(check_order),
        Tool(apply_discount, requires_approval=True),
    ]


@workflow("agent_order", version=1)
def agent_order(ctx: Context, spec: dict) -> dict:
    agent = Agent(scripted_model(spec["script"]), tools=tools(), instructions="You handle orders.")
    return {"output": run_agent(ctx, agent, spec.get("prompt", "Handle order o-1."))}


@workflow("agent_follow_up", version=1)
def agent_follow_up(ctx: Context, spec: dict) -> dict:
    """One agent asked twice in a run: a question, then a follow-up on the same conversation."""
    agent = Agent(scripted_model(spec["script"]), tools=tools(), instructions="You handle orders.")
    first = run_agent(ctx, agent, "Handle order o-1.")
    second = run_agent(ctx, agent, "Anything else for order o-1?")
    return {"first": first, "second": second}
