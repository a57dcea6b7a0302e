"""The chaos benchmark's agent, written three ways (registered by SAGAS_MODULES=bench.chaos_workflows).

The shape is the simulated crash table's (``bench/chaos.py``): a 7-step agent, four model calls that bill 2.0 each (8.0
per run when nothing crashes) and three effects, against the real simulated
providers. The three workflows differ only in how a step is made durable:

* ``chaos_restart``: nothing is journaled. A crashed run starts over.
* ``chaos_journal``: every step is a ``ctx.step``, so its result is journaled;
  effects are plain calls with no stable idempotency key.
* ``chaos_keyed``: the product. Model calls and effects go through the ledger
  (``ctx.effect``) under stable keys.

Crashes: each step that really executes in this process crashes with chance
``BENCH_CRASH_CHANCE``, at one of the simulation's three positions, picked at
random: before the work, after the work but before its result is recorded, or after
it is recorded. The crash is a SIGKILL of the worker process by itself. A step
replayed from the journal, or an effect settled by recovery, runs nothing and so
cannot crash, just as it costs nothing.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

from demo import client
from demo.connectors import CapturePayment, CompleteModel, CreateShipment, ReserveStock
from ledger import connector
from sagas import Context, workflow

PRICE = 2.0  # per model call; four calls make 8.0 per run
SHAPE = (  # (step, kind): the simulation's 7 steps, 3 of them effects
    ("plan", "model"), ("capture", "payments"), ("choose", "model"), ("reserve", "inventory"),
    ("label", "model"), ("ship", "shipping"), ("summarise", "model"),
)
PLAIN_PATHS = {"model": "/model/complete", "payments": "/payments/capture", "inventory": "/inventory/reserve",
               "shipping": "/shipping/create"}
KEYED_CONNECTORS = {"model": "chaos.model.complete", "payments": "chaos.payments.capture",
                    "inventory": "chaos.inventory.reserve", "shipping": "chaos.shipping.create"}

_dice = random.SystemRandom()  # not the module's generator: forked workers must not share a sequence
_ran_live = threading.local()


def _crash_position() -> int | None:
    """Where this attempt crashes (0, 1 or 2), or None. The chance is read on every roll, so
    one bench process can fork workers for several chances."""
    chance = float(os.environ.get("BENCH_CRASH_CHANCE", "0"))
    return _dice.randrange(3) if chance and _dice.random() < chance else None


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def live(work: Callable[..., Any]) -> Callable[..., Any]:
    """``work`` as one live attempt of a step, which may crash before or after the work."""

    def attempt(*args: Any, **kwargs: Any) -> Any:
        position = _crash_position()
        if position == 0:
            _crash()  # before the work
        result = work(*args, **kwargs)
        if position == 1:
            _crash()  # the work is done, its result is not recorded yet
        _ran_live.crash_after_record = position == 2
        return result

    return attempt


def recorded() -> None:
    """The third position: the step's result is recorded (journaled, or the effect's outcome
    ledgered). Crashes only if this step's live attempt picked it."""
    if getattr(_ran_live, "crash_after_record", False):
        _ran_live.crash_after_record = False
        _crash()


def payload(kind: str, ref: str) -> dict[str, Any]:
    """The request of one step. ``ref`` (run id and step) names the logical action, so the
    providers' books show how many times each one really executed."""
    if kind == "model":
        return {"prompt": f"{ref}: decide the next action", "price": PRICE, "ref": ref}
    if kind == "payments":
        return {"order": ref, "amount_cents": 4999, "currency": "EUR", "ref": ref}
    if kind == "inventory":
        return {"sku": "SKU-CHAOS", "qty": 1, "ref": ref}
    return {"order": ref, "address": "1 Chaos Lane", "ref": ref}


def plain_call(kind: str, ref: str) -> dict[str, Any]:
    """A call as code without idempotency keys makes it: providers that insist on a key get a
    fresh one per call, which is no key at all for deduplication."""
    key = "" if kind in ("model", "inventory") else uuid.uuid4().hex
    return client.call("POST", PLAIN_PATHS[kind], payload(kind, ref), key=key)


@workflow("chaos_restart", version=1, max_steps=100, approve_irreversible=False)
def chaos_restart(ctx: Context, _input: dict) -> str:
    for step, kind in SHAPE:
        live(plain_call)(kind, f"{ctx.run_id}:{step}")
        recorded()
    return "done"


@workflow("chaos_journal", version=1, max_steps=100, approve_irreversible=False)
def chaos_journal(ctx: Context, _input: dict) -> str:
    for step, kind in SHAPE:
        ctx.step(step, live(plain_call), kind, f"{ctx.run_id}:{step}")
        recorded()
    return "done"


@workflow("chaos_keyed", version=1, max_steps=100, approve_irreversible=False)
def chaos_keyed(ctx: Context, _input: dict) -> str:
    for step, kind in SHAPE:
        ctx.effect(step, KEYED_CONNECTORS[kind], payload(kind, f"{ctx.run_id}:{step}"))
        recorded()
    return "done"


# The demo connectors, with the two in-flight crash positions around their call.


@connector("chaos.model.complete")
class ChaosModel(CompleteModel):
    execute = live(CompleteModel.execute)


@connector("chaos.payments.capture")
class ChaosCapture(CapturePayment):
    execute = live(CapturePayment.execute)


@connector("chaos.inventory.reserve")
class ChaosReserve(ReserveStock):
    execute = live(ReserveStock.execute)


@connector("chaos.shipping.create")
class ChaosShip(CreateShipment):
    execute = live(CreateShipment.execute)
