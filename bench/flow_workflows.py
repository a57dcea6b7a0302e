"""bench/flow.py's workflows and connectors (registered by SAGAS_MODULES=bench.flow_workflows).

* ``flow_send``: one ledgered effect on the connector its input names: ``email.send`` (the
  demo's, against the simulated providers' ``/email/send``) for the burst, ``bench.flow_mail``
  for the circuit's timeline;
* ``flow_noop20``: twenty effects on ``bench.flow_noop``, a connector that makes no call at all,
  so what flow control costs each effect is not hidden behind HTTP.

``bench.flow_mail`` is the demo's ``email.send`` (same provider endpoint, same errors, neither
idempotent nor with a lookup) declaring the circuit breaker the timeline is about (5 failures,
2 s cool-down), and writing one line per call it sends (``time.time()`` just before the
request, the dispatch mark the gate's transaction gave this attempt, how it ended, the key) to
``$BENCH_FLOW_CALLS/<pid>.log``: what the provider saw and when, to set against the circuit's
changes.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from demo.connectors import SendEmail
from ledger import Connector, connector
from sagas import Context, workflow

_log_lock = threading.Lock()


def _log_call(sent: float, marked: float, outcome: str, key: str) -> None:
    folder = os.environ.get("BENCH_FLOW_CALLS")
    if not folder:
        return
    with _log_lock, open(os.path.join(folder, f"{os.getpid()}.log"), "a") as log:
        log.write(f"{sent:.6f} {marked:.6f} {outcome} {key}\n")


def _marked_at(key: str) -> float:
    """When the gate let this attempt go: its record's dispatch mark, committed just before."""
    from ledger.models import EffectRecord

    at = EffectRecord.objects.filter(idempotency_key=key).values_list("dispatched_at", flat=True).first()
    return at.timestamp() if at is not None else 0.0


@connector("bench.flow_mail")
class FlakyMail(SendEmail):
    """``email.send`` with the circuit breaker the timeline shows: open after 5 failures, one
    trial call after 2 s. Ten attempts per effect, not three: on a loaded machine (the test
    suite beside it) the circuit once took 0.65 s to see its 5 failures, and an early effect had
    spent its three attempts (0.2 s back-off, doubling) by then and failed its run; the timeline
    is about the breaker, not one effect's attempts."""

    max_attempts = 10
    circuit_failures = 5
    circuit_window_seconds = 60.0
    circuit_cooldown_seconds = 2.0

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        marked = _marked_at(key)
        sent = time.time()
        outcome = "ok"
        try:
            return super().execute(payload, key=key)
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            _log_call(sent, marked, outcome, key)


@connector("bench.flow_noop")
class Noop(Connector):
    """Makes no call: its result is its key. Idempotent, so its intent's commit is also its
    dispatch mark (the gate's check runs in that commit), as for most real connectors."""

    idempotent = True

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return {"id": key}


@workflow("flow_send", version=1)
def flow_send(ctx: Context, spec: dict) -> dict:
    return ctx.effect("send", spec["connector"],
                      {"to": "bench@example.com", "subject": f"flow {spec['n']}", "body": "bench/flow.py"})


@workflow("flow_noop20", version=1)
def flow_noop20(ctx: Context, _spec: dict) -> int:
    for i in range(20):
        ctx.effect("e", "bench.flow_noop", {"i": i})
    return 20
