"""The agent of bench/agents.py, and its crash model: the part every variant shares.

Pure: it imports nothing from this repository and no Django, only the standard
library and pydantic-ai, so the DBOS virtualenv (bench/agents_dbos_pure.py)
imports it too.

The agent is a scripted ``FunctionModel`` of four turns: turn 1 asks for
``capture_payment``, turn 2 for ``reserve_stock``, turn 3 for ``ship_order``, and
turn 4 answers with the final text. The turn is read from the conversation so far
(how many tool results it holds), as a real model would read it. Each turn is
one completion at the demo's model gateway (``POST /model/complete``, price 2.0,
so 8.0 per run when nothing crashes); the gateway bills each execution, and a
request whose ``Idempotency-Key`` it has seen is answered from its cache, unbilled.
The turn sends that header only when the run's model settings carry one
(``extra_headers``), which only our integration does.

Every request names its logical action in ``ref`` (the run's ref and the turn or
the tool), so the providers' own books count repeats:
``count(*) - count(DISTINCT request->>'ref')``.

The crash model is bench/chaos_workflows.py's: each model turn and each tool
call that really executes in this process crashes with chance
``BENCH_CRASH_CHANCE`` at one of three positions picked at random: before the
work, after the work but before its record, or after the record. The last one
fires at the start of the run's next turn or tool call in this process, or when
the run's last step has returned (``finished``): by then whatever the variant
records (a journal entry, a DBOS checkpoint, nothing at all) is written. A
crash is a SIGKILL of this process by itself. What a variant replays from its
records runs nothing, so it cannot crash, just as it costs nothing.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

PRICE = 2.0  # per model turn: four turns make 8.0 per run
TURNS = 4
TOOLS = ("capture_payment", "reserve_stock", "ship_order")  # what turns 1, 2 and 3 ask for
TOOL_KIND = {"capture_payment": "payments", "reserve_stock": "inventory", "ship_order": "shipping"}
PATHS = {"payments": "/payments/capture", "inventory": "/inventory/reserve", "shipping": "/shipping/create"}
ACTION = {"payments": "capture", "inventory": "reserve", "shipping": "ship"}  # the suffix of a tool's ref
PROMPT = "Order {ref}: capture the payment, reserve the stock, then ship it."
FINAL = "Order {ref} is paid, reserved and shipped."
TIMEOUT_S = 30.0

T = TypeVar("T")

_dice = random.SystemRandom()  # forked processes must not share a sequence
_lock = threading.Lock()
_crash_after_record: set[str] = set()  # run refs whose last live step picked the third position


# --- the crash model ----------------------------------------------------------


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _pending(ref: str) -> None:
    """Crash now if the run's previous live step picked "after the record"."""
    with _lock:
        due = ref in _crash_after_record
        _crash_after_record.discard(ref)
    if due:
        _crash()


def live(ref: str, work: Callable[[], T]) -> T:
    """One live step of run ``ref``: ``work()``, which may crash before or after it.

    The chance is read on every roll, so one supervisor can run cells of several chances."""
    _pending(ref)
    chance = float(os.environ.get("BENCH_CRASH_CHANCE", "0"))
    position = _dice.randrange(3) if chance and _dice.random() < chance else None
    if position == 0:
        _crash()  # before the work
    result = work()
    if position == 1:
        _crash()  # the work is done, its record is not written yet
    if position == 2:
        with _lock:
            _crash_after_record.add(ref)  # crashes at the run's next step, or when it finishes
    return result


def finished(ref: str) -> None:
    """Run ``ref``'s last step has returned: a crash after that step's record happens here."""
    _pending(ref)


# --- the providers --------------------------------------------------------------


def providers_url() -> str:
    return os.environ["BENCH_PROVIDERS_URL"].rstrip("/")


def post(path: str, body: dict[str, Any], *, key: str = "") -> dict[str, Any]:
    """One JSON POST to the simulated providers; any answer but a 2xx raises."""
    headers = {"Content-Type": "application/json", "Accept": "application/json", "X-Caller-Pid": str(os.getpid())}
    if key:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(providers_url() + path, data=json.dumps(body).encode(), method="POST",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"POST {path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc


def tool_payload(kind: str, order: str) -> dict[str, Any]:
    """The request of one tool call for run ``order``; its ``ref`` names the logical action."""
    ref = f"{order}:{ACTION[kind]}"
    if kind == "payments":
        return {"order": order, "amount_cents": 4999, "currency": "EUR", "ref": ref}
    if kind == "inventory":
        return {"sku": "SKU-AGENT", "qty": 1, "ref": ref}
    return {"order": order, "address": "1 Agent Lane", "ref": ref}


def run_ref_of(action_ref: str) -> str:
    """The run's ref in a request's ``ref`` ("<run ref>:capture" -> "<run ref>")."""
    return action_ref.rsplit(":", 1)[0]


def plain_tool(kind: str, order: str) -> dict[str, Any]:
    """A tool call as code without idempotency keys makes it (bench/chaos_workflows.plain_call):
    providers that insist on a key get a fresh one per call, no key at all for deduplication."""
    key = "" if kind == "inventory" else uuid.uuid4().hex
    return live(order, lambda: post(PATHS[kind], tool_payload(kind, order), key=key))


# --- the scripted model -----------------------------------------------------------


def run_ref(messages: list[ModelMessage]) -> str:
    """The run's ref, from the user prompt that opens the conversation."""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    found = re.match(r"Order (\S+):", part.content)
                    if found:
                        return found.group(1)
    raise ValueError("no 'Order <ref>:' user prompt in the conversation")


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One model turn: a billed completion at the gateway, then the scripted answer."""
    ref = run_ref(messages)
    turn = 1 + sum(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)
    key = ((info.model_settings or {}).get("extra_headers") or {}).get("Idempotency-Key", "")
    body = {"prompt": f"Order {ref}, turn {turn}: decide the next action", "price": PRICE, "ref": f"{ref}:turn-{turn}"}
    live(ref, lambda: post("/model/complete", body, key=key))
    if turn <= len(TOOLS):
        tool = TOOLS[turn - 1]
        return ModelResponse(parts=[ToolCallPart(tool, {"order": ref}, tool_call_id=f"{ref}:call-{turn}")])
    return ModelResponse(parts=[TextPart(FINAL.format(ref=ref))])


def model() -> FunctionModel:
    return FunctionModel(script, model_name="bench-scripted")


def prompt(ref: str) -> str:
    return PROMPT.format(ref=ref)


def plain_agent() -> Agent[None, str]:
    """The agent as plain code writes it: its tools call the providers with no stable key."""

    def capture_payment(order: str) -> dict[str, Any]:
        """Capture the order's payment (49.99 EUR)."""
        return plain_tool("payments", order)

    def reserve_stock(order: str) -> dict[str, Any]:
        """Reserve one unit of the order's item."""
        return plain_tool("inventory", order)

    def ship_order(order: str) -> dict[str, Any]:
        """Create the order's shipment."""
        return plain_tool("shipping", order)

    return Agent(model(), name="order_agent", tools=[capture_payment, reserve_stock, ship_order])
