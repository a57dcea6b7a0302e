"""Every failure window between our commit and a downstream's action that concerns effects, with real workers, a real
provider process and real SIGKILLs. The providers' own tables count real executions."""

from __future__ import annotations

import pytest

from demo.models import ProviderFault
from demo.providers.faults import inject
from demo.providers.selectors import executions
from ledger.models import EffectRecord, EffectStatus
from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.runtime.queue import enqueue_advance
from tests.ledger import wf_orders  # noqa: F401
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def effect(run, step: str) -> EffectRecord:
    return EffectRecord.objects.get(run_id=run.id, step_name=step)


def wait_status(run, wanted: str, timeout: float = 30) -> None:
    wait_until(lambda: status(run) == wanted, timeout, what=f"run {run.id} to be {wanted} (is {status(run)})")


def test_it_sends_an_email_once_and_reports_nothing_unknown_after_a_crash_before_dispatch(stack):
    run = start("email_only", {"id": "o-1"})
    first = stack.worker("w1", SAGAS_CRASH_AT="after_intent:email")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash between intent and dispatch")
    record = effect(run, "email")
    assert record.status == EffectStatus.PENDING and record.attempts == 0  # known: never dispatched
    stack.worker("w2")
    wait_status(run, RunStatus.COMPLETED)
    assert executions("email", "send").count() == 1
    assert effect(run, "email").status == EffectStatus.SUCCEEDED
    assert not EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).exists()


def test_it_captures_once_after_a_crash_before_dispatch(stack):
    run = start("capture_only", {"id": "o-2"})
    first = stack.worker("w1", SAGAS_CRASH_AT="after_intent:capture")
    wait_until(lambda: not first.alive(), 20, what="w1 to crash between intent and dispatch")
    assert executions("payments", "capture").count() == 0
    stack.worker("w2")
    wait_status(run, RunStatus.COMPLETED)
    assert executions("payments", "capture").count() == 1  # lookup said "not executed", then one capture
    assert not EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).exists()


def test_it_recovers_a_capture_by_lookup_after_the_provider_killed_its_caller(stack):
    run = start("capture_only", {"id": "o-3"})
    inject("payments", "capture", "kill_caller_after_work")
    first = stack.worker("w1")
    wait_until(lambda: not first.alive(), 20, what="the provider to SIGKILL w1 after capturing")
    assert first.popen.returncode == -9
    assert effect(run, "capture").status == EffectStatus.IN_PROGRESS  # the worker died holding it
    stack.worker("w2")
    wait_status(run, RunStatus.COMPLETED)
    [execution] = executions("payments", "capture")
    run.refresh_from_db()
    assert run.result["transaction_id"] == execution.response["transaction_id"]
    record = effect(run, "capture")
    assert record.status == EffectStatus.SUCCEEDED and record.resolution == "lookup"


def test_it_leaves_an_email_unknown_when_the_provider_killed_its_caller_after_sending(stack):
    run = start("email_only", {"id": "o-4"})
    inject("email", "send", "kill_caller_after_work")
    first = stack.worker("w1")
    wait_until(lambda: not first.alive(), 20, what="the provider to SIGKILL w1 after sending")
    stack.worker("w2")
    wait_status(run, RunStatus.NEEDS_ATTENTION)
    run.refresh_from_db()
    assert run.status_reason == "effect_unknown"
    assert executions("email", "send").count() == 1  # sent once, and not sent again on a guess
    record = effect(run, "email")
    assert record.status == EffectStatus.UNKNOWN
    assert "neither a status lookup nor idempotency" in record.error_message


def test_it_reconciles_a_timed_out_capture_and_resumes_the_run(stack):
    run = start("capture_only", {"id": "o-5"})
    inject("payments", "capture", "timeout_after_work")
    stack.worker("w1")
    wait_until(lambda: JournalEntry.objects.filter(run=run, kind="halted").exists(), 30, what="the timeout")
    assert JournalEntry.objects.get(run=run, kind="halted").payload["code"] == "effect_unknown"
    wait_status(run, RunStatus.COMPLETED, timeout=40)  # the reconciler's lookup found it and woke the run
    assert executions("payments", "capture").count() == 1
    record = effect(run, "capture")
    assert record.status == EffectStatus.SUCCEEDED and record.resolution == "lookup"
    assert record.resolved_by_label == "reconciler"
    kinds = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert kinds.index("halted") < kinds.index("effect_resolved") < kinds.index("resumed") < kinds.index("completed")


def test_it_keeps_a_timed_out_email_unknown_until_a_person_resolves_it(stack):
    from ledger.errors import AlreadyResolved
    from ledger.services import effect_resolve

    run = start("email_only", {"id": "o-6"})
    inject("email", "send", "timeout_after_work")
    stack.worker("w1")
    wait_status(run, RunStatus.NEEDS_ATTENTION)
    assert executions("email", "send").count() == 1
    record = effect(run, "email")
    assert record.status == EffectStatus.UNKNOWN and record.error_class == "Timeout"

    effect_resolve(effect_id=record.id, outcome="succeeded", note="seen in the mail log", user=None,
                   actor="alice", downstream_ref="msg-from-log")
    wait_status(run, RunStatus.COMPLETED)
    run.refresh_from_db()
    assert run.result == {"message_id": "msg-from-log"}  # the connector turned the evidence into its result
    assert executions("email", "send").count() == 1  # resolving did not send again
    with pytest.raises(AlreadyResolved, match="already resolved by alice at"):
        effect_resolve(effect_id=record.id, outcome="failed", note="second try", user=None, actor="bob")


def test_it_executes_once_under_duplicate_deliveries_and_repeated_resumes(stack):
    run = start("order3", {"id": "o-7"})
    for _ in range(5):  # the same wake-up delivered five times, to two workers
        enqueue_advance(str(run.id), run.definition_hash)
    stack.worker("w1")
    stack.worker("w2")
    wait_status(run, RunStatus.COMPLETED)
    for _ in range(3):  # and resumed again after it finished
        enqueue_advance(str(run.id), run.definition_hash)
    wait_until(lambda: not EffectRecord.objects.exclude(status=EffectStatus.SUCCEEDED).exists(), 5)
    assert executions("payments", "capture").count() == 1
    assert executions("inventory", "reserve").count() == 1
    assert executions("email", "send").count() == 1
    assert JournalEntry.objects.filter(run=run, kind="effect_intent").count() == 3


def test_it_executes_once_when_two_workers_recover_the_same_run_at_once(stack):
    run = start("order3", {"id": "o-8"})
    first = stack.worker("w1", SAGAS_CRASH_AT="after_dispatch:reserve")  # reserve done, not recorded
    wait_until(lambda: not first.alive(), 20, what="w1 to crash after the reservation")
    enqueue_advance(str(run.id), run.definition_hash)
    enqueue_advance(str(run.id), run.definition_hash)
    stack.worker("w2")
    stack.worker("w3")
    wait_status(run, RunStatus.COMPLETED)
    assert executions("payments", "capture").count() == 1
    assert executions("inventory", "reserve").count() == 1  # found by lookup, not reserved again
    assert executions("email", "send").count() == 1
    claims = list(JournalEntry.objects.filter(run=run, kind="claimed").values_list("worker_id", flat=True))
    assert claims[0] == "w1" and len(claims) == 2  # exactly one of w2/w3 got it


def test_it_never_retries_a_final_error(stack):
    run = start("capture_only", {"id": "o-9"})
    inject("payments", "capture", "final", times=3)
    stack.worker("w1")
    wait_status(run, RunStatus.FAILED)
    record = effect(run, "capture")
    assert record.status == EffectStatus.FAILED_FINAL and record.attempts == 1
    assert record.error_class == "Final"
    assert executions("payments", "capture").count() == 0
    from demo.models import ProviderFault

    assert ProviderFault.objects.get().remaining == 2  # the provider saw exactly one request


def test_it_refuses_a_reused_key_with_a_different_payload_and_executes_nothing(stack):
    first = start("capture_only", {"id": "o-10", "capture_key": "capture:order-10:v1", "amount_cents": 1000})
    stack.worker("w1")
    wait_status(first, RunStatus.COMPLETED)
    second = start("capture_only", {"id": "o-10b", "capture_key": "capture:order-10:v1", "amount_cents": 2000})
    wait_status(second, RunStatus.FAILED)
    second.refresh_from_db()
    assert "already used by run" in second.error["message"] and "nothing was executed" in second.error["message"]
    refused = JournalEntry.objects.get(run=second, kind="effect_refused")
    assert refused.payload["key"] == "capture:order-10:v1"
    assert executions("payments", "capture").count() == 1
    assert EffectRecord.objects.count() == 1


def test_it_resumes_a_run_parked_for_an_email_whose_answer_a_frozen_worker_brings_back(stack):
    """A worker is frozen (SIGSTOP, as a stalled container or a VM migration does) while the
    provider sends an email, and stays frozen past its lease. Another worker takes the run over,
    cannot know whether the email went out (no lookup, not idempotent) and parks the run for a
    person. Then the frozen worker comes back (SIGCONT) with the provider's answer: that answer
    settles the effect, and the run it parked resumes by itself and completes. One email."""
    import signal

    from sagas.models import JournalKind

    inject("email", "send", "latency:3")  # the provider answers 3 s after the call
    run = start("email_only", {"id": "frozen-1"})
    frozen = stack.worker("w1", SAGAS_LEASE_TTL="1")
    # Frozen only once the request has reached the provider (it took the latency fault): the
    # effect's IN_PROGRESS intent is committed before the call, and a worker frozen between the
    # two never sends the email until it is thawed (under load that window was wide enough).
    wait_until(lambda: ProviderFault.objects.filter(provider="email", operation="send", remaining=0).exists(), 30,
               what="the email request to reach the provider")
    frozen.signal(signal.SIGSTOP)  # frozen while the provider works: no heartbeat, the lease runs out
    stack.worker("w2", SAGAS_LEASE_TTL="1")
    wait_status(run, RunStatus.NEEDS_ATTENTION)
    run.refresh_from_db()
    assert (run.status_reason, effect(run, "email").status) == ("effect_unknown", EffectStatus.UNKNOWN)
    wait_until(lambda: executions("email", "send").count() == 1, 30, what="the provider to send the email")

    frozen.signal(signal.SIGCONT)  # w1 reads the provider's answer, but the run is no longer its own
    wait_status(run, RunStatus.COMPLETED)

    record = effect(run, "email")
    sent = executions("email", "send").get()
    assert record.status == EffectStatus.SUCCEEDED and record.resolution == "late_answer", record.resolution
    run.refresh_from_db()
    assert run.result == {"message_id": sent.response["message_id"]}  # what the provider really answered
    assert executions("email", "send").count() == 1  # nobody sent it again
    kinds = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert JournalKind.EFFECT_RESOLVED in kinds and JournalKind.RESUMED in kinds, kinds
    assert frozen.alive(), frozen.log()
