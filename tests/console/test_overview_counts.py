"""Every line of the overview's "Needs a person" counts exactly what the page it links to lists:
the same querysets, the same tenants. FAILED runs are there with why they failed, ages read as
people say them, and the chart has axes."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import EffectRecord, EffectStatus
from operators.models import TenantScope
from sagas.models import ApprovalRequest, RunStatus, WorkflowRun
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db

NA = RunStatus.NEEDS_ATTENTION
LINE = re.compile(r'<tr class="queue-line[^"]*" id="queue-[^"]+">\s*<td>(?:<span class="muted">↳ </span>)?'
                  r'<a href="([^"]+)">([^<]+)</a></td>\s*<td class="num">(\d+)</td>\s*<td>(.*?)</td>', re.S)


def run(status: str, reason: str = "", tenant: str = "acme", age: timedelta = timedelta(0)) -> WorkflowRun:
    made = WorkflowRun.objects.create(workflow_name="oc", version=1, definition_hash="0" * 64, status=status,
                                      status_reason=reason, tenant=tenant)
    if age:
        WorkflowRun.objects.filter(id=made.id).update(updated_at=timezone.now() - age)
    return made


def effect(status: str, tenant: str = "acme", age: timedelta = timedelta(minutes=3)) -> EffectRecord:
    owner = run(NA, "effect_unknown", tenant) if status == EffectStatus.UNKNOWN else run(RunStatus.RUNNING, "", tenant)
    return EffectRecord.objects.create(
        tenant=tenant, idempotency_key=f"oc-{uuid.uuid4()}", run_id=owner.id, step_name="capture",
        connector="oc.pay", request_payload={}, payload_hash="0" * 64, status=status,
        intent_at=timezone.now() - age, attempts=1,
    )


def approval(tenant: str = "acme", age: timedelta = timedelta(minutes=4)) -> ApprovalRequest:
    now = timezone.now()
    return ApprovalRequest.objects.create(run=run(RunStatus.WAITING, "", tenant), step="ship", reason="ship it",
                                          requested_at=now - age, deadline=now + timedelta(hours=1))


def a_bit_of_everything(tenant: str) -> None:
    effect(EffectStatus.UNKNOWN, tenant)
    # Dispatched by a worker that died: no live lease holds its run. The effects queue lists it
    # as stuck, and the overview used to leave it out (6 counted, 7 listed).
    effect(EffectStatus.IN_PROGRESS, tenant)
    approval(tenant)
    run(NA, "compensation_failed", tenant)
    run(NA, "compensation_unknown", tenant)
    run(NA, "version_mismatch", tenant)
    run(NA, "budget_exceeded", tenant)
    run(NA, "non_determinism", tenant)
    run(RunStatus.FAILED, "step_failed", tenant)
    run(RunStatus.FAILED, "step_failed", tenant)
    run(RunStatus.FAILED, "workflow_error", tenant)
    run(RunStatus.COMPLETED, "", tenant)
    # Paused: a run of its own (listed), and a finished one whose flag stayed set (not listed).
    WorkflowRun.objects.filter(id=run(RunStatus.PENDING, "", tenant).id).update(paused_at=timezone.now())
    WorkflowRun.objects.filter(id=run(RunStatus.CANCELLED, "cancelled", tenant).id).update(paused_at=timezone.now())


def overview_lines(client) -> dict[str, tuple[str, int, str]]:
    html = client.get(reverse("console:overview")).content.decode()
    return {label: (href.replace("&amp;", "&"), int(n), age.strip()) for href, label, n, age in LINE.findall(html)}


def rows_on(client, href: str) -> int:
    response = client.get(href)
    assert response.status_code == 200, href
    html = response.content.decode()
    if href.startswith(reverse("console:effects")):
        return html.count('<tr id="effect-')
    if href.startswith(reverse("console:approvals")):
        return html.split("Recently decided")[0].count('<tr id="approval-')
    assert href.startswith(reverse("console:runs") + "?"), f"{href} is not a filtered list"
    return html.count('class="run-row')


def test_it_counts_on_each_line_what_the_page_it_links_to_lists(people):
    a_bit_of_everything("acme")
    a_bit_of_everything("globex")
    TenantScope.objects.create(user=people["operator"], tenants=["acme"])  # a tenant-limited user too

    for who, per_tenant in (("viewer", 2), ("operator", 1)):
        client = client_for(people[who])
        lines = overview_lines(client)
        assert {label: n for label, (_, n, _) in lines.items()} == {
            "Unknown effects": 2 * per_tenant, "Pending approvals": per_tenant,
            "Failed compensations": 2 * per_tenant, "Version mismatches": per_tenant,
            "Exhausted budgets": per_tenant, "Models unavailable": 0, "Non-deterministic runs": per_tenant,
            "Failed runs": 3 * per_tenant, "a step failed": 2 * per_tenant,
            "the workflow raised an error": per_tenant, "Paused runs": per_tenant,
        }, who
        for label, (href, n, _) in lines.items():
            assert rows_on(client, href) == n, (who, label, href)


def test_it_lists_failed_runs_with_their_reason_under_needs_a_person(people):
    failed = run(RunStatus.FAILED, "approval_rejected", age=timedelta(minutes=20))
    lines = overview_lines(client_for(people["viewer"]))
    assert lines["Failed runs"][1] == 1 and lines["Failed runs"][2].endswith(">20 min</time>")
    href, n, _ = lines["an approval was rejected"]
    assert n == 1 and "status=FAILED" in href and "reason=approval_rejected" in href
    assert str(failed.id)[:8] in client_for(people["viewer"]).get(href).content.decode()


def test_it_shows_ages_as_people_say_them(people):
    effect(EffectStatus.UNKNOWN, age=timedelta(seconds=40))
    approval(age=timedelta(minutes=12, seconds=30))
    run(NA, "version_mismatch", age=timedelta(hours=3, minutes=10))
    run(NA, "budget_exceeded", age=timedelta(days=2, hours=5))
    lines = overview_lines(client_for(people["viewer"]))
    ages = {label: age for label, (_, _, age) in lines.items()}
    assert re.fullmatch(r'<time datetime="[^"]+" title="since [^"]+ UTC">4\d s</time>', ages["Unknown effects"])
    assert ">12 min</time>" in ages["Pending approvals"]
    assert ">3 h</time>" in ages["Version mismatches"]
    assert ">2 d</time>" in ages["Exhausted budgets"]
    assert ages["Failed runs"] == "–"



def test_it_ages_a_line_of_several_reasons_by_its_oldest_item(people):
    run(NA, "compensation_unknown", age=timedelta(minutes=5))
    run(NA, "compensation_failed", age=timedelta(hours=4, minutes=2))
    run(NA, "compensation_unknown", age=timedelta(minutes=30))
    _, n, age = overview_lines(client_for(people["viewer"]))["Failed compensations"]
    assert n == 3 and age.endswith(">4 h</time>")

def test_it_draws_the_chart_with_labelled_axes(people):
    for _ in range(7):
        run(RunStatus.PENDING)
    html = client_for(people["viewer"]).get(reverse("console:overview")).content.decode()
    chart = html[html.index('<svg class="chart"'):html.index("</svg>", html.index('<svg class="chart"'))]
    y_axis = chart[chart.index('class="axis y-axis"'):chart.index('class="axis x-axis"')]
    x_axis = chart[chart.index('class="axis x-axis"'):]
    # The scale rounds 7 up to 10: 0, 5 and 10 runs a minute.
    assert re.findall(r">(\d+)</text>", y_axis) == ["0", "5", "10"]
    times = re.findall(r">(\d\d:\d\d)</text>", x_axis)
    assert len(times) == 6 and all(t.endswith("0") for t in times)
    assert "style=" not in chart
    minutes = re.findall(r"<title>\d\d:\d\d · started (\d+) · finished (\d+)</title>", chart)
    assert len(minutes) == 60 and sum(int(s) for s, _ in minutes) == 7
