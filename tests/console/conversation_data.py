"""Test data of a run's conversation: an order agent with a scripted model (pydantic-ai's
``FunctionModel``, no network) run by ``sagas.agents.run_agent``, with a plain tool, two effect
tools (one irreversible, so it waits for ``approve:ship_order``), one whose outcome is UNKNOWN, and an
approval-required tool.

``agent_run(turns)`` starts the workflow with a script: each turn is the model's text and its
tool calls (or ``fail``: the model request raises), and after the last one the model answers
``final``: a text, or a dict for a structured ``OrderReport`` (through pydantic-ai's output
tool, ``final_result``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ledger import Connector, Timeout, Unknown, connector
from sagas import Context, start, workflow
from sagas.agents import effect_tool, run_agent
from sagas.models import WorkflowRun, WorkflowVersion
from sagas.replay.engine import advance
from sagas.versions import registry

AGENT = "order"
MODEL = "cv-scripted"


@connector("cv.charge")
class Charge(Connector):
    def execute(self, payload, *, key):
        return {"transaction_id": f"tx-{payload['order']}", "amount_cents": payload["amount_cents"]}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{payload['order']}"}


@connector("cv.ship")
class Ship(Connector):
    irreversible = True

    def execute(self, payload, *, key):
        return {"shipment_id": f"sh-{payload['order']}"}


@connector("cv.refund")
class Refund(Connector):
    """Times out, and its lookup cannot tell: the effect is UNKNOWN until a person decides."""

    def execute(self, payload, *, key):
        raise Timeout("no answer in 2 s")

    def lookup(self, key):
        return Unknown("the provider cannot tell")


def lookup_order(order: str, api_key: str = "", note: str = "") -> dict:
    """Look the order up."""
    return {"order": order, "status": "paid", "items": 2}


@effect_tool("cv.charge")
def capture_payment(order: str, amount_cents: int) -> dict:
    """Capture the order's payment."""
    return {"order": order, "amount_cents": amount_cents}


@effect_tool("cv.ship")
def ship_order(order: str) -> dict:
    """Ship the order."""
    return {"order": order}


@effect_tool("cv.refund")
def refund_payment(order: str) -> dict:
    """Refund the order's payment."""
    return {"order": order}


def notify_customer(order: str, message: str) -> dict:
    """Tell the customer."""
    return {"sent": True, "order": order}


class OrderReport(BaseModel):
    order: str
    shipped: bool


def _script(turns: list[dict], final: str | dict):
    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(isinstance(m, ModelResponse) for m in messages)
        if n < len(turns):
            turn = turns[n]
            if turn.get("fail"):
                raise RuntimeError(turn["fail"])
            parts: list[Any] = [TextPart(turn["text"])] if turn.get("text") else []
            parts += [ToolCallPart(tool, args, tool_call_id=f"call-{n + 1}-{i}")
                      for i, (tool, args) in enumerate(turn.get("calls", []))]
            return ModelResponse(parts=parts)
        if isinstance(final, dict):  # a structured output: the model calls the output tool
            return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, final, tool_call_id="call-final")])
        return ModelResponse(parts=[TextPart(final)])

    return script


@workflow("cv_agent", version=1)
def cv_agent(ctx: Context, spec: dict) -> Any:
    agent = Agent(
        FunctionModel(_script(spec["turns"], spec["final"]), model_name=MODEL),
        instructions=spec.get("instructions", "You handle orders."),
        tools=[lookup_order, capture_payment, ship_order, refund_payment,
               Tool(notify_customer, requires_approval=True)],
        output_type=OrderReport if isinstance(spec["final"], dict) else str,
    )
    output = run_agent(ctx, agent, spec["prompt"], name=AGENT)
    return output.model_dump() if isinstance(output, BaseModel) else output


def version_registered() -> None:
    """The definition's row in the versions table, as a worker starting up writes it (the
    sagas.services cache of versions already written outlives the test's transaction)."""
    d = registry.get("cv_agent")
    WorkflowVersion.objects.get_or_create(name=d.name, version=d.version, definition_hash=d.definition_hash,
                                          defaults={"source": d.source, "module": d.module})


def agent_run(turns: list[dict], *, final: str | dict = "Done.", prompt: str = "Order o-1: handle it",
              **options: Any) -> WorkflowRun:
    run = start("cv_agent", {"turns": turns, "final": final, "prompt": prompt}, **options)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    return run
