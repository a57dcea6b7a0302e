"""OpenTelemetry traces of runs: the span tree and its attributes, one trace per run, no second
span for journaled work, and the traceparent a connector sends.

In this process with the SDK's in-memory exporter, and on real worker processes exporting
OTLP/HTTP to a real receiver process (``tests/sagas/otlp_receiver.py``) with a SIGKILL in the
middle of a run.
"""

from __future__ import annotations

import json
import os
import re
import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sagas import start, tracing
from sagas.models import RunStatus, WorkflowRun
from sagas.testing import crash_at, expire_lease, run_until_idle
from tests.procs import wait_until
from tests.sagas import wf_tracing

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.start_exporting(exporter)
    wf_tracing.sent.clear()
    yield exporter
    tracing.stop_exporting()


def by_name(finished) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in finished:
        found.setdefault(span.name, []).append(span)
    return found


def traceparent(span) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


def test_it_traces_each_step_once_across_a_crash_and_the_replay_after_it(spans):
    run = start("traced_order", {"id": "o-1"}, business_key="order-1", tenant="acme")
    with crash_at("before_step", "ship"):  # quote and pay are journaled; the worker dies
        run_until_idle(run.id, owner="w1")
    expire_lease(run.id)
    run = run_until_idle(run.id, owner="w2")  # replays quote and pay, executes ship
    assert run.status == RunStatus.COMPLETED

    found = by_name(spans.get_finished_spans())
    assert sorted((name, len(s)) for name, s in found.items()) == [
        ("effect pay", 1), ("run traced_order", 2), ("step quote", 1), ("step ship", 1)]
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {uuid.UUID(str(run.id)).int}
    lost, second = sorted(found["run traced_order"], key=lambda s: s.attributes["saga.attempt"])
    # w1 never ended its attempt: w2 exported it for w1, with the id its children name.
    assert lost.attributes["saga.worker"] == "w1" and lost.attributes["saga.attempt.lost"] is True
    assert lost.status.status_code == StatusCode.ERROR and lost.parent is None
    assert second.attributes["saga.worker"] == "w2" and second.attributes["saga.outcome"] == "completed"
    [quote], [pay], [ship] = found["step quote"], found["effect pay"], found["step ship"]
    assert quote.parent.span_id == pay.parent.span_id == lost.context.span_id
    assert ship.parent.span_id == second.context.span_id
    assert dict(pay.attributes) == {
        "saga.run_id": str(run.id), "saga.workflow": "traced_order", "saga.version": 1,
        "saga.business_key": "order-1", "saga.tenant": "acme", "saga.effect": "pay",
        "saga.connector": "tracing_tests.pay", "saga.idempotency_key": f"{run.id}:pay",
        "saga.effect.status": "SUCCEEDED",
    }
    assert ship.attributes["saga.step"] == "ship" and ship.status.status_code == StatusCode.UNSET
    # The connector was given the effect's span to send to its provider.
    assert wf_tracing.sent == [{"call": "pay", "traceparent": traceparent(pay)}]


def test_it_traces_a_failed_step_and_the_compensation_it_caused(spans):
    run = run_until_idle(start("traced_refund", {"id": "o-2"}).id)
    assert run.status == RunStatus.COMPENSATED

    found = by_name(spans.get_finished_spans())
    [attempt], [pay], [pack], [refund] = (found[n] for n in (
        "run traced_refund", "effect pay", "step pack", "compensation pay"))
    assert attempt.attributes["saga.outcome"] == "compensated"
    assert pack.status.status_code == StatusCode.ERROR and pack.attributes["error.type"] == "ValueError"
    assert refund.parent.span_id == attempt.context.span_id
    assert refund.attributes["saga.idempotency_key"] == f"{run.id}:pay:compensate"
    assert refund.attributes["saga.effect.status"] == "SUCCEEDED"
    assert [s["traceparent"] for s in wf_tracing.sent] == [traceparent(pay), traceparent(refund)]


def test_it_adds_no_span_and_no_header_when_tracing_is_off():
    wf_tracing.sent.clear()
    run = run_until_idle(start("traced_order", {"id": "o-3"}).id)
    assert run.status == RunStatus.COMPLETED
    assert wf_tracing.sent == [{"call": "pay"}]


# --- real processes: OTLP over HTTP, a worker killed with SIGKILL -----------------------------------


MODULES = "tests.sagas.wf_tracing"


def test_it_exports_one_trace_per_run_across_a_killed_worker(procs, step_calls, providers_url,
                                                                _session_providers, tmp_path):
    received = tmp_path / "spans.jsonl"
    receiver = procs.start("otlp", ["-m", "tests.sagas.otlp_receiver", str(received)], dict(os.environ))
    url = wait_until(lambda: re.search(r"listening on (http://\S+)", receiver.log()), 30, what="the receiver")[1]
    offset = _session_providers.log_offset()
    env = {"SAGAS_TRACING": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_SERVICE_NAME": "saga-workers", "DEMO_PROVIDERS_URL": providers_url}

    def spans() -> list[dict]:
        return [json.loads(line) for line in received.read_text().splitlines()] if received.exists() else []

    def names() -> list[str]:
        return sorted(s["name"] for s in spans())

    run = start("traced_checkout", {"id": "o-4", "slow": 60.0}, business_key="order-4", tenant="acme")
    first = procs.worker("w1", MODULES, **env)
    # s1 and the charge are journaled and exported; s2 is in flight when w1 dies.
    wait_until(lambda: step_calls.counts(run.id).get("s2") and "effect charge" in names(), 30,
               what="w1 to export s1 and the charge and start s2")
    first.kill()
    procs.worker("w2", MODULES, **env)
    wait_until(lambda: WorkflowRun.objects.get(id=run.id).status == RunStatus.COMPLETED, 30, what="w2 to finish")
    wait_until(lambda: names().count("run traced_checkout") == 2 and "step s3" in names(), 15,
               what="w2's spans to arrive")

    got = spans()
    assert names() == ["effect charge", "run traced_checkout", "run traced_checkout", "step s1", "step s2",
                       "step s3"]
    assert {s["trace_id"] for s in got} == {uuid.UUID(str(run.id)).hex}
    assert {s["service"] for s in got} == {"saga-workers"}
    ids = {s["span_id"] for s in got}
    assert all(s["parent_span_id"] in ids for s in got if s["parent_span_id"])  # no span without its parent
    attempts = {s["attributes"]["saga.worker"]: s for s in got if s["name"] == "run traced_checkout"}
    assert attempts["w1"]["attributes"]["saga.attempt.lost"] is True
    parents = {s["name"]: s["parent_span_id"] for s in got if s["parent_span_id"]}
    assert parents["step s1"] == parents["effect charge"] == attempts["w1"]["span_id"]
    assert parents["step s2"] == parents["step s3"] == attempts["w2"]["span_id"]
    assert step_calls.counts(run.id)["s2"] == 2  # executed twice, but only w2's execution ended: one span
    # The payment provider logged the charge's traceparent: its logs lead to the effect.
    [charge] = [s for s in got if s["name"] == "effect charge"]
    assert charge["attributes"]["saga.idempotency_key"] == f"{run.id}:charge"
    provider_log = _session_providers.log_since(offset)
    assert f"traceparent='00-{charge['trace_id']}-{charge['span_id']}-01'" in provider_log, provider_log
