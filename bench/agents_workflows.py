"""bench/agents.py's agent run by our integration (registered by SAGAS_MODULES=bench.agents_workflows).

The same scripted agent as the other two variants (bench/agents_shared.py), run
with ``sagas.agents.run_agent`` inside the workflow ``agent_order``: each model
turn is a journaled step whose request carries the Idempotency-Key run_agent
derives from the run and the turn, and each tool is an ``effect_tool`` through a
ledgered connector, so it runs under the ledger's stable key, with a lookup
after a crash.

The connectors are the demo's (bench/chaos.py's are the same ones), with the
crash model of bench/agents_shared.py around their call, as bench/chaos_workflows.py
puts its ``live()`` around them. chaos's own connectors are not used as they are:
their third crash position (after the record) waits for a ``recorded()`` call on
the thread that ran the effect, which is the workflow's thread here, while the
agent's next turn runs on the agent's thread; agents_shared keys that position by
run instead, so it fires at the run's next live step whichever thread runs it.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent

from bench.agents_shared import FINAL, finished, live, model, prompt, run_ref_of, tool_payload
from demo.connectors import CapturePayment, CreateShipment, ReserveStock
from ledger import connector
from sagas import Context, workflow
from sagas.agents import effect_tool, run_agent


def _live(execute: Any) -> Any:
    """A connector's ``execute`` as one live step of the run its payload names."""

    def attempt(self: Any, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return live(run_ref_of(payload["ref"]), lambda: execute(self, payload, key=key))

    return attempt


@connector("agents.payments.capture")
class AgentCapture(CapturePayment):
    execute = _live(CapturePayment.execute)


@connector("agents.inventory.reserve")
class AgentReserve(ReserveStock):
    execute = _live(ReserveStock.execute)


@connector("agents.shipping.create")
class AgentShip(CreateShipment):
    execute = _live(CreateShipment.execute)


@effect_tool("agents.payments.capture")
def capture_payment(order: str) -> dict[str, Any]:
    """Capture the order's payment (49.99 EUR)."""
    return tool_payload("payments", order)


@effect_tool("agents.inventory.reserve")
def reserve_stock(order: str) -> dict[str, Any]:
    """Reserve one unit of the order's item."""
    return tool_payload("inventory", order)


@effect_tool("agents.shipping.create")
def ship_order(order: str) -> dict[str, Any]:
    """Create the order's shipment."""
    return tool_payload("shipping", order)


AGENT = Agent(model(), name="order_agent", tools=[capture_payment, reserve_stock, ship_order])


@workflow("agent_order", version=1, max_steps=100, approve_irreversible=False)
def agent_order(ctx: Context, _input: dict) -> str:
    ref = str(ctx.run_id)
    output = run_agent(ctx, AGENT, prompt(ref), name="order")
    finished(ref)  # a crash after the last turn's journal entry, before the run's end is recorded
    if output != FINAL.format(ref=ref):
        raise ValueError(f"the agent answered {output!r}")
    return output
