"""Scripts for the order agent and what the tests read back: run status, the gateway's books."""

from __future__ import annotations

import json
from typing import Any

from demo.providers.selectors import executions, replays
from sagas.models import WorkflowRun
from tests.procs import wait_until

CAPTURE = {"tool": "capture_payment", "args": {"order": "o-1", "amount_cents": 4999}}
EMAIL = {"tool": "send_email", "args": {"to": "o-1@example.com", "subject": "Order o-1", "body": "Thanks!"}}
SHIP = {"tool": "ship_order", "args": {"order": "o-1", "address": "1 Main St"}}
CHECK = {"tool": "check_order", "args": {"order": "o-1"}}
DISCOUNT = {"tool": "apply_discount", "args": {"order": "o-1", "percent": 10}}


def script(*moves: dict[str, Any] | str) -> list[dict[str, Any]]:
    """One move per model turn: a tool call (or a list of them), or the final text."""
    out = []
    for move in moves:
        if isinstance(move, str):
            out.append({"text": move})
        else:
            out.append({"calls": move if isinstance(move, list) else [move]})
    return out


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def wait_status(run, wanted: str, timeout: float = 30) -> WorkflowRun:
    wait_until(lambda: status(run) == wanted, timeout, what=f"run {run.id} to be {wanted} (is {status(run)})")
    return WorkflowRun.objects.get(id=run.id)


def billed() -> int:
    """Completions the gateway executed and billed."""
    return executions("model", "complete").count()


def cached() -> int:
    """Requests the gateway answered from its cache (a key it had seen): not billed."""
    return replays("model", "complete").count()


def prompts() -> list[dict[str, Any]]:
    """What the model was given on each billed turn, oldest first (the gateway kept the body)."""
    return [json.loads(e.request["prompt"]) for e in executions("model", "complete")]


def tool_returns(prompt: dict[str, Any], tool: str) -> list[Any]:
    return [p["content"] for p in prompt["received"] if p["kind"] == "tool-return" and p["tool"] == tool]



def wait_finished(run, timeout: float = 30) -> WorkflowRun:
    """The run once it has stopped moving: finished, or parked for a person."""
    settled = {"COMPLETED", "FAILED", "NEEDS_ATTENTION", "COMPENSATED", "CANCELLED"}
    wait_until(lambda: status(run) in settled, timeout, what=f"run {run.id} to settle (is {status(run)})")
    return WorkflowRun.objects.get(id=run.id)
