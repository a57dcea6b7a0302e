"""``/metrics``: the token, the exposition format, and values that match the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from console import metrics
from ledger.models import EffectStatus
from sagas import start
from sagas.models import (
    ApprovalState,
    JournalEntry,
    RunStatus,
    WorkerProcess,
    WorkflowRun,
)
from tests.console import wf_workers  # noqa: F401  (registers the workflows in this process)
from tests.console.queue_data import make_approval, make_effect, make_run
from tests.procs import wait_until

TOKEN = "s3cret-metrics-token-0123456789"
# Only a guard against a real hang, for waits on an observable state.
HANG = 300.0


def scrape(token: str | None = TOKEN, *, openmetrics: bool = False) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape, by (sample name, sorted labels), in the text format Prometheus
    2.x reads (``version=0.0.4``), or in OpenMetrics as Prometheus asks for it first."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if openmetrics:
        headers["Accept"] = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    response = Client().get("/metrics", headers=headers)
    assert response.status_code == 200, response.content[:300]
    if openmetrics:
        assert response["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        families = openmetrics_families(response.content.decode())
    else:
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
        families = text_string_to_metric_families(response.content.decode())
    samples = {}
    for family in families:
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(autouse=True)
def fresh_totals():
    """No running totals (nor final-status counts) left in Redis by an earlier test's database."""
    redis.Redis.from_url(django_settings.REDIS_URL).delete(metrics.totals_key())


@pytest.mark.django_db
def test_it_answers_404_without_a_token_configured_and_401_without_the_right_bearer_token(settings):
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404

    settings.METRICS_TOKEN = TOKEN
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}, {"Authorization": "Bearer"}):
        response = Client().get("/metrics", headers=headers)
        assert response.status_code == 401, headers
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"sagas_" not in response.content
    assert Client().post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405
    assert "sagas_runs" in {name for name, _ in scrape()}
    assert ("sagas_steps_total", (("outcome", "failed"),)) in scrape(openmetrics=True)


@pytest.mark.django_db
def test_it_reports_runs_attention_items_and_workers_as_the_database_has_them(settings):
    settings.METRICS_TOKEN = TOKEN
    now = timezone.now()
    for status, reason in ((RunStatus.PENDING, ""), (RunStatus.PENDING, ""), (RunStatus.COMPLETED, ""),
                           (RunStatus.FAILED, "workflow_error"), (RunStatus.NEEDS_ATTENTION, "version_mismatch"),
                           (RunStatus.NEEDS_ATTENTION, "budget_exceeded")):
        make_run(status=status, reason=reason)
    WorkflowRun.objects.filter(status=RunStatus.FAILED).update(updated_at=now - timedelta(minutes=30))
    make_effect(age=timedelta(minutes=20))
    make_effect(age=timedelta(minutes=2))
    make_effect(status=EffectStatus.SUCCEEDED)
    make_approval()
    make_approval(state=ApprovalState.APPROVED, step="other")
    compensating = make_run(status=RunStatus.NEEDS_ATTENTION, reason="compensation_failed")
    WorkflowRun.objects.filter(id=compensating.id).update(updated_at=now - timedelta(minutes=7))
    make_run(status=RunStatus.FAILED, reason="approval_rejected")
    WorkerProcess.objects.create(name="w-live", hostname="h", pid=1, started_at=now, last_seen_at=now)
    WorkerProcess.objects.create(name="w-silent", hostname="h", pid=2, started_at=now,
                                 last_seen_at=now - timedelta(minutes=5))
    WorkerProcess.objects.create(name="w-killed-last-week", hostname="h", pid=4, started_at=now - timedelta(days=8),
                                 last_seen_at=now - timedelta(days=7))  # past the workers page's silent window
    WorkerProcess.objects.create(name="w-stopped", hostname="h", pid=3, started_at=now, last_seen_at=now,
                                 stopped_at=now)

    samples = scrape()

    # The runs made above, by status: the loop's six, one per effect (NEEDS_ATTENTION) and per
    # approval (WAITING), the failed compensation and the rejected approval.
    made = {RunStatus.PENDING: 2, RunStatus.COMPLETED: 1, RunStatus.FAILED: 2, RunStatus.NEEDS_ATTENTION: 2 + 3 + 1,
            RunStatus.WAITING: 2}
    for status in RunStatus.values:
        assert value(samples, "sagas_runs", status=status) == made.get(status, 0), status
    expected = {"unknown_effects": 2, "approvals": 1, "failed_compensations": 1, "version_mismatch": 1,
                "budget_exceeded": 1, "non_determinism": 0, "failed_runs": 2}
    for kind, n in expected.items():
        assert value(samples, "sagas_attention_items", kind=kind) == n, kind
    assert value(samples, "sagas_failed_runs", reason="workflow_error") == 1
    assert value(samples, "sagas_failed_runs", reason="approval_rejected") == 1
    assert 20 * 60 <= value(samples, "sagas_attention_oldest_age_seconds", kind="unknown_effects") < 21 * 60
    assert 30 * 60 <= value(samples, "sagas_attention_oldest_age_seconds", kind="failed_runs") < 31 * 60
    assert 7 * 60 <= value(samples, "sagas_attention_oldest_age_seconds", kind="failed_compensations") < 8 * 60
    assert value(samples, "sagas_attention_oldest_age_seconds", kind="non_determinism") == 0
    assert value(samples, "sagas_workers_live") == 1 and value(samples, "sagas_workers_silent") == 1
    assert value(samples, "sagas_metrics_counters_available") == 1

    make_run(status=RunStatus.PENDING, reason="")
    make_run(status=RunStatus.COMPLETED, reason="")
    again = scrape()
    assert value(again, "sagas_runs", status="PENDING") == 3, "counted every scrape"
    assert value(again, "sagas_runs", status="COMPLETED") == 1, (
        f"final statuses are recounted every {metrics.FINAL_REFRESH:g} s, not every scrape")


def _entry(run: WorkflowRun, kind: str, payload: dict, *, age: timedelta = timedelta(minutes=1), name: str = "x"):
    run.last_seq += 1
    run.save(update_fields=["last_seq"])
    return JournalEntry.objects.create(run=run, seq=run.last_seq, kind=kind, name=name, payload=payload,
                                       created_at=timezone.now() - age)


@pytest.mark.django_db
def test_it_counts_journaled_outcomes_once_each_and_only_once_they_are_settled(settings):
    settings.METRICS_TOKEN = TOKEN
    before = scrape()
    run = make_run(status=RunStatus.RUNNING, reason="")
    for _ in range(3):
        _entry(run, "step", {"value": 1})
    _entry(run, "step", {"error": {"type": "KeyError", "message": "k"}})
    _entry(run, "effect_result", {"status": "SUCCEEDED", "result": {}, "downstream_ref": "ch_1"})
    _entry(run, "effect_result", {"status": "SUCCEEDED", "result": {}, "downstream_ref": "ch_2"})
    _entry(run, "effect_result", {"status": "FAILED_FINAL", "error_class": "Declined", "message": "no"})
    _entry(run, "effect_refused", {"key": "k", "message": "reused"})
    _entry(run, "halted", {"code": "effect_unknown", "message": "timeout"})
    _entry(run, "halted", {"code": "budget_exceeded", "message": "not an effect"})
    _entry(run, "compensation_result", {"status": "SUCCEEDED", "result": {}, "downstream_ref": "re_1"})
    _entry(run, "halted", {"code": "compensation_unknown", "message": "timeout"})
    fresh = _entry(run, "step", {"value": "too young to count"}, age=timedelta(0))

    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("sagas_steps_total", outcome="succeeded") == 3
    assert delta("sagas_steps_total", outcome="failed") == 1
    assert delta("sagas_effects_total", kind="effect", outcome="succeeded") == 2
    assert delta("sagas_effects_total", kind="effect", outcome="failed") == 1
    assert delta("sagas_effects_total", kind="effect", outcome="refused") == 1
    assert delta("sagas_effects_total", kind="effect", outcome="unknown") == 1
    assert delta("sagas_effects_total", kind="compensation", outcome="succeeded") == 1
    assert delta("sagas_effects_total", kind="compensation", outcome="unknown") == 1
    assert delta("sagas_effects_total", kind="compensation", outcome="failed") == 0

    again = scrape()
    assert value(again, "sagas_steps_total", outcome="succeeded") == value(after, "sagas_steps_total",
                                                                           outcome="succeeded"), "counted once"
    assert fresh.created_at > timezone.now() - metrics.SETTLE


def _settled(runs) -> bool:
    """Every journal entry of ``runs`` is older than ``metrics.SETTLE`` by PostgreSQL's clock
    (what the scrape counts by)."""
    with connection.cursor() as cur:
        cur.execute("SELECT now() - max(created_at) > %s FROM sagas_journalentry WHERE run_id = ANY(%s::uuid[])",
                    [metrics.SETTLE, [str(r.id) for r in runs]])
        return bool(cur.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_it_counts_a_real_workers_steps_and_dispatch_latency(settings, procs):
    """Runs advanced by a real worker: every step entry is counted under its outcome, and each
    run's first claim is one dispatch-latency observation."""
    settings.METRICS_TOKEN = TOKEN
    before = scrape()
    runs = [start("wk_quick", {}, business_key=f"q-{i}") for i in range(5)]
    procs.worker("wk-metrics", "tests.console.wf_workers")
    wait_until(lambda: WorkflowRun.objects.filter(id__in=[r.id for r in runs], status=RunStatus.COMPLETED).count() == 5,
               HANG, what="five runs completed")
    wait_until(lambda: _settled(runs), HANG, what="the runs' journal entries to be SETTLE old by the database's clock")

    after = scrape()

    steps = JournalEntry.objects.filter(run_id__in=[r.id for r in runs], kind="step")
    failed = steps.filter(payload__has_key="error").count()
    assert failed == 5 and steps.count() == 10
    assert value(after, "sagas_steps_total", outcome="succeeded") - value(before, "sagas_steps_total",
                                                                          outcome="succeeded") == 5
    assert value(after, "sagas_steps_total", outcome="failed") - value(before, "sagas_steps_total",
                                                                       outcome="failed") == 5
    observed = value(after, "sagas_dispatch_latency_seconds_count") - value(before, "sagas_dispatch_latency_seconds_count")
    assert observed == 5
    waited = sum((r.started_at - r.created_at).total_seconds() for r in WorkflowRun.objects.filter(id__in=[x.id for x in runs]))
    total = value(after, "sagas_dispatch_latency_seconds_sum") - value(before, "sagas_dispatch_latency_seconds_sum")
    assert total == pytest.approx(waited, abs=0.05)
    assert value(after, "sagas_dispatch_latency_seconds_bucket", le="+Inf") - value(
        before, "sagas_dispatch_latency_seconds_bucket", le="+Inf") == 5


@pytest.mark.django_db
def test_it_still_answers_the_gauges_when_redis_is_away_and_says_the_counters_are_missing(settings):
    settings.METRICS_TOKEN = TOKEN
    make_run(status=RunStatus.WAITING, reason="")
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens on the discard port

    samples = scrape()

    assert value(samples, "sagas_runs", status="WAITING") == 1
    assert value(samples, "sagas_metrics_counters_available") == 0
    assert not any(name.startswith(("sagas_steps", "sagas_effects", "sagas_dispatch")) for name, _ in samples)


@pytest.mark.django_db
def test_it_serves_the_last_stored_counters_while_another_scrape_holds_the_totals(settings):
    settings.METRICS_TOKEN = TOKEN
    run = make_run(status=RunStatus.RUNNING, reason="")
    _entry(run, "step", {"value": 1})
    first = scrape()
    _entry(run, "step", {"value": 2})
    held = redis.Redis.from_url(django_settings.REDIS_URL).lock(f"{metrics.totals_key()}:lock", timeout=HANG)
    assert held.acquire(blocking=False)
    try:
        waiting = scrape()
        # It answered while the totals were still held (it did not wait the lock out) ...
        assert held.owned(), "the lock expired: the scrape waited it out"
    finally:
        held.release()

    # ... with the counters as last stored, not advanced past the held totals
    assert value(waiting, "sagas_metrics_counters_available") == 1
    assert value(waiting, "sagas_steps_total", outcome="succeeded") == value(first, "sagas_steps_total",
                                                                             outcome="succeeded")
    assert value(scrape(), "sagas_steps_total", outcome="succeeded") == value(
        first, "sagas_steps_total", outcome="succeeded") + 1, "advanced again once the lock is free"
