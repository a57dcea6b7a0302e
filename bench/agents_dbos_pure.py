"""bench/agents.py's agent under pydantic-ai's own DBOS integration (``pydantic_ai.durable_exec.dbos``).

Runs inside the virtualenv bench/agents.py makes (``.bench/agents-dbos``: DBOS
Transact 3.4 and pydantic-ai-slim[dbos] 2.68.0), never in ours: it imports
neither Django nor this repository, only bench/agents_shared.py (pure), loaded
by its path. Started with ``python -P`` so that bench/ (which holds our
bench/dbos.py) does not shadow the ``dbos`` package.

The agent is bench/agents_shared.py's, with the ``DBOSDurability`` capability:
each model request is a DBOS step, and each tool is a ``@DBOS.step()`` as
pydantic-ai's DBOS guide asks of tools that do I/O (the capability leaves
function tools in workflow code). One ``@DBOS.workflow()`` per run, with the
run's ref as its workflow id, calls ``agent.run``. Like the plain variant, the
tools send no stable idempotency key.

One invocation is one process of one supervisor slot: it launches DBOS as
executor ``slot-N`` (so ``DBOS.launch()`` recovers this slot's PENDING
workflows after a SIGKILL, as DBOS does on a restart), then runs its refs one
after the other: a ref DBOS already knows is awaited, others are started. It
exits 0 once every ref's workflow has returned; bench/agents.py restarts it
after each crash. ``--reset`` only drops and re-creates DBOS's system
database, before a cell.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import importlib.util
import signal
import sys
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSDurability

_spec = importlib.util.spec_from_file_location("agents_shared", Path(__file__).resolve().parent / "agents_shared.py")
assert _spec is not None and _spec.loader is not None
shared = importlib.util.module_from_spec(_spec)
sys.modules["agents_shared"] = shared
_spec.loader.exec_module(shared)


@DBOS.step()
async def capture_payment(order: str) -> dict[str, Any]:
    """Capture the order's payment (49.99 EUR)."""
    return shared.plain_tool("payments", order)


@DBOS.step()
async def reserve_stock(order: str) -> dict[str, Any]:
    """Reserve one unit of the order's item."""
    return shared.plain_tool("inventory", order)


@DBOS.step()
async def ship_order(order: str) -> dict[str, Any]:
    """Create the order's shipment."""
    return shared.plain_tool("shipping", order)


agent = Agent(shared.model(), name="order_agent", tools=[capture_payment, reserve_stock, ship_order],
              capabilities=[DBOSDurability()])


@DBOS.workflow()
async def order_run(ref: str) -> str:
    result = await agent.run(shared.prompt(ref))
    shared.finished(ref)  # a crash after the last step's checkpoint, before the workflow's output is recorded
    return result.output


async def run_refs(refs: list[str]) -> None:
    for ref in refs:
        if await DBOS.get_workflow_status_async(ref) is None:
            with SetWorkflowID(ref):
                handle = await DBOS.start_workflow_async(order_run, ref)
        else:  # started before a crash: DBOS.launch() recovers it, this waits for it
            handle = await DBOS.retrieve_workflow_async(ref)
        output = await handle.get_result()
        if output != shared.FINAL.format(ref=ref):
            raise SystemExit(f"workflow {ref} returned {output!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True, help="DBOS's system database")
    parser.add_argument("--slot", type=int, default=0, help="the supervisor's slot: DBOS executor id slot-N")
    parser.add_argument("--refs", default="", help="comma-separated run refs, run in this order")
    parser.add_argument("--reset", action="store_true", help="drop and re-create DBOS's system database, then exit")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # bench/agents.py asks a stalled slot where it is
    config: DBOSConfig = {
        # One DBOS application per slot: a slot's queue thread then never claims another slot's
        # recovered workflow, which that slot's process is waiting for, and cancels it on exit.
        "name": f"saga-bench-agents-slot-{args.slot}",
        "system_database_url": args.database_url,
        "log_level": "WARNING",
        "executor_id": f"slot-{args.slot}",
        # Fixed per slot (DBOS wants a version per application): every restart recovers its workflows.
        "application_version": f"bench-agents-1-slot-{args.slot}",
    }
    DBOS(config=config)
    if args.reset:
        DBOS.reset_system_database()
        DBOS.launch()
        DBOS.destroy()
        return
    DBOS.launch()
    try:
        asyncio.run(run_refs([r for r in args.refs.split(",") if r]))
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
