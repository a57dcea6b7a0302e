"""The queues people work through (ambiguous effects, approvals), the versions page and the audit
log, driven with the Django test client against real PostgreSQL."""

from __future__ import annotations

import csv
import io
import re
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console import live
from console.models import AuditEntry, AuditOutcome
from ledger import Connector, connector
from ledger.models import EffectRecord, EffectStatus
from ledger.outcomes import NotExecuted, Succeeded, Unknown
from sagas import Context, start, workflow
from sagas.engine import advance
from sagas.models import (
    ApprovalRequest,
    ApprovalState,
    JournalEntry,
    RunStatus,
    WorkerProcess,
    WorkflowRun,
    WorkflowVersion,
)
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


# --- workflows and connectors of this module ---------------------------------------------------


@workflow("qp_ship", version=1)
def qp_ship(ctx: Context, order: dict) -> str:
    ctx.approval("ship", reason=f"Irreversible: ship order {order['id']}", timeout=timedelta(hours=4))
    return "shipped"


@connector("qp.lookup")
class LookupConnector(Connector):
    answer = Unknown("the provider is unsure")

    def execute(self, payload, *, key):  # pragma: no cover - never dispatched in these tests
        raise AssertionError("the console must not dispatch effects")

    def lookup(self, key):
        return type(self).answer


@connector("qp.blind")
class BlindConnector(Connector):
    def execute(self, payload, *, key):  # pragma: no cover
        raise AssertionError("the console must not dispatch effects")


# --- data ---------------------------------------------------------------------------------------




def make_run(*, status=RunStatus.NEEDS_ATTENTION, reason="effect_unknown", name="qp_orders", version=1,
             definition_hash="a" * 64, started_by=None, **fields) -> WorkflowRun:
    return WorkflowRun.objects.create(
        workflow_name=name, version=version, definition_hash=definition_hash, status=status,
        status_reason=reason, started_by=started_by, **fields,
    )


def make_effect(*, run=None, status=EffectStatus.UNKNOWN, age=timedelta(minutes=5), connector="qp.blind",
                step="capture", **fields) -> EffectRecord:
    run = run or make_run()
    now = timezone.now()
    values = {
        "tenant": "default", "idempotency_key": f"{step}-{uuid.uuid4()}", "run_id": run.id, "step_name": step,
        "connector": connector, "request_payload": {"order": "o-1", "amount_cents": 4999},
        "payload_hash": "0" * 64, "status": status, "intent_at": now - age, "dispatched_at": now - age,
        "attempts": 1, "error_class": "Timeout", "error_message": "no answer within 2.0 s",
    }
    values.update(fields)
    return EffectRecord.objects.create(**values)


def make_approval(*, run=None, step="ship", deadline_in=timedelta(hours=2), state=ApprovalState.PENDING,
                  reason="Irreversible: ship goods", **fields) -> ApprovalRequest:
    run = run or make_run(status=RunStatus.WAITING, reason="")
    now = timezone.now()
    return ApprovalRequest.objects.create(
        run=run, step=step, reason=reason, requested_at=now - timedelta(minutes=1), deadline=now + deadline_in,
        state=state, **fields,
    )


def resolve(client: Client, effect: EffectRecord, *, expected: str | None = "UNKNOWN", **data):
    form = {"outcome": "succeeded", "downstream_ref": "ch_123", "note": "provider dashboard shows ch_123 captured"}
    form.update(data)
    if expected is not None:
        form["expected"] = expected
    return client.post(reverse("console:effect_resolve", args=[effect.id]), form)


def text(response) -> str:
    return response.content.decode()


# --- access -------------------------------------------------------------------------------------


def test_it_requires_login_on_every_page_and_action():
    effect = make_effect()
    approval = make_approval()
    anonymous = Client()
    for name in ("effects", "approvals", "versions", "audit", "audit_csv"):
        response = anonymous.get(reverse(f"console:{name}"))
        assert response.status_code == 302 and reverse("console:login") in response["Location"], name
    for url in (reverse("console:effect_query", args=[effect.id]), reverse("console:effect_resolve", args=[effect.id]),
                reverse("console:approval_decide", args=[approval.id])):
        assert anonymous.post(url, {"decision": "approve", "note": "x"}).status_code == 302
    effect.refresh_from_db()
    approval.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and approval.state == ApprovalState.PENDING


def test_it_refuses_pages_to_an_account_without_a_console_role(people):
    response = client_for(people["nobody"]).get(reverse("console:effects"))
    assert response.status_code == 403


def test_it_refuses_an_action_without_a_csrf_token(people):
    effect = make_effect()
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    response = resolve(client, effect)
    assert response.status_code == 403
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


# --- ambiguous effects --------------------------------------------------------------------------


def test_it_lists_unknown_and_stuck_effects_oldest_first_and_nothing_settled(people):
    newer = make_effect(age=timedelta(minutes=2), step="newer")
    older = make_effect(age=timedelta(hours=3), step="older")
    settled = make_effect(status=EffectStatus.SUCCEEDED, age=timedelta(days=1), step="settled")
    stuck = make_effect(status=EffectStatus.IN_PROGRESS, age=timedelta(minutes=30), step="stuck",
                        run=make_run(status=RunStatus.RUNNING, reason="", lease_owner="gone:1",
                                     lease_expires_at=timezone.now() - timedelta(minutes=1)))
    in_hand = make_effect(status=EffectStatus.IN_PROGRESS, age=timedelta(minutes=40), step="in_hand",
                          run=make_run(status=RunStatus.RUNNING, reason="", lease_owner="w:1",
                                       lease_expires_at=timezone.now() + timedelta(seconds=30)))

    page = text(client_for(people["viewer"]).get(reverse("console:effects")))

    anchors = re.findall(r'id="effect-(\d+)"', page)
    assert anchors == [str(older.id), str(stuck.id), str(newer.id)]
    assert f'id="effect-{settled.id}"' not in page and f'id="effect-{in_hand.id}"' not in page
    assert f'href="/runs/{older.run_id}/"' in page
    assert older.idempotency_key in page and "Timeout" in page and "no answer within 2.0 s" in page
    assert "3\xa0hours" in page  # how long it has been unknown


def test_it_shows_actions_only_to_roles_that_may_take_them(people):
    with_lookup = make_effect(connector="qp.lookup", step="with_lookup")
    make_effect(connector="qp.blind", step="blind")
    viewer_page = text(client_for(people["viewer"]).get(reverse("console:effects")))
    assert "Query provider" not in viewer_page and "Record resolution" not in viewer_page

    operator_page = text(client_for(people["operator"]).get(reverse("console:effects")))
    assert operator_page.count("Query provider") == 1
    assert reverse("console:effect_query", args=[with_lookup.id]) in operator_page
    assert operator_page.count("Record resolution") == 2


def test_it_reports_what_the_provider_said_when_queried(people):
    client = client_for(people["operator"])
    unsure = make_effect(connector="qp.lookup", step="unsure")
    LookupConnector.answer = Unknown("the provider is unsure")
    response = client.post(reverse("console:effect_query", args=[unsure.id]), follow=True)
    assert response.status_code == 200
    assert "Unknown: the provider could not say" in text(response)
    unsure.refresh_from_db()
    assert unsure.status == EffectStatus.UNKNOWN

    done = make_effect(connector="qp.lookup", step="done")
    LookupConnector.answer = Succeeded(result={"id": "ch_9"}, downstream_ref="ch_9")
    try:
        response = client.post(reverse("console:effect_query", args=[done.id]), follow=True)
    finally:
        LookupConnector.answer = Unknown("the provider is unsure")
    assert "Succeeded" in text(response)
    done.refresh_from_db()
    assert done.status == EffectStatus.SUCCEEDED and done.downstream_ref == "ch_9"
    assert f'id="effect-{done.id}"' not in text(response)

    gone = make_effect(connector="qp.lookup", step="gone")
    LookupConnector.answer = NotExecuted()
    try:
        response = client.post(reverse("console:effect_query", args=[gone.id]), follow=True)
    finally:
        LookupConnector.answer = Unknown("the provider is unsure")
    assert "NotExecuted" in text(response)
    gone.refresh_from_db()
    assert gone.status == EffectStatus.PENDING
    assert AuditEntry.objects.filter(action="effect.query", outcome=AuditOutcome.OK).count() == 3


def test_it_resolves_an_effect_with_evidence_as_operator_and_wakes_its_run(people):
    effect = make_effect()
    client = client_for(people["operator"])

    response = resolve(client, effect)

    assert response.status_code == 302 and response["Location"] == reverse("console:effects")
    page = text(client.get(response["Location"]))
    assert f"Effect #{effect.id} (capture) resolved as succeeded, reference ch_123" in page
    assert f'id="effect-{effect.id}"' not in page
    effect.refresh_from_db()
    assert effect.status == EffectStatus.SUCCEEDED and effect.downstream_ref == "ch_123"
    assert effect.resolved_by == people["operator"] and effect.resolution_note.startswith("provider dashboard")
    entry = AuditEntry.objects.get(action="effect.resolve")
    assert entry.outcome == AuditOutcome.OK and entry.actor_label == "olga" and entry.object_id == str(effect.id)
    assert entry.before["state"] == "UNKNOWN" and entry.after["state"] == "SUCCEEDED"
    assert entry.after["downstream_ref"] == "ch_123" and entry.reason.startswith("provider dashboard")
    run = WorkflowRun.objects.get(id=effect.run_id)
    assert run.status == RunStatus.PENDING
    assert JournalEntry.objects.filter(run=run, kind="effect_resolved").exists()


def test_it_refuses_a_resolution_without_a_note_and_changes_nothing(people):
    effect = make_effect()
    response = resolve(client_for(people["operator"]), effect, note="   ")

    assert response.status_code == 409
    assert "a note with the evidence is required" in text(response)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and effect.resolved_at is None
    assert WorkflowRun.objects.get(id=effect.run_id).status == RunStatus.NEEDS_ATTENTION
    assert list(AuditEntry.objects.values_list("outcome", flat=True)) == [AuditOutcome.REFUSED]


def test_it_refuses_succeeded_without_a_downstream_reference(people):
    effect = make_effect()
    response = resolve(client_for(people["operator"]), effect, downstream_ref="")
    assert response.status_code == 409
    assert "needs the downstream reference" in text(response)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_it_tells_the_second_resolver_who_resolved_it_and_when(people):
    effect = make_effect()
    assert resolve(client_for(people["operator"]), effect).status_code == 302
    effect.refresh_from_db()
    when = f"{effect.resolved_at:%Y-%m-%d %H:%M:%S} UTC"

    # Same page, loaded before the first resolution (expected UNKNOWN).
    response = resolve(client_for(people["operator2"]), effect, outcome="not_executed",
                       note="I think it never happened")
    assert response.status_code == 409
    assert f"This effect is now SUCCEEDED (already resolved by olga at {when}" in text(response)
    # A bare POST that does not say what its sender saw is not even compared (400).
    response = resolve(client_for(people["operator2"]), effect, expected=None, outcome="not_executed",
                       note="I think it never happened")
    assert response.status_code == 400 and "which state you saw" in text(response)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.SUCCEEDED and effect.resolved_by == people["operator"]
    assert AuditEntry.objects.filter(action="effect.resolve", outcome=AuditOutcome.REFUSED).count() == 2


def test_it_denies_a_viewers_forged_post_and_audits_it(people):
    effect = make_effect()
    response = resolve(client_for(people["viewer"]), effect)

    assert response.status_code == 403
    assert "it needs the operator role" in text(response)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN
    entry = AuditEntry.objects.get()
    assert (entry.actor_label, entry.action, entry.outcome, entry.object_id) == (
        "vera", "effect.resolve", AuditOutcome.DENIED, str(effect.id))


def test_it_answers_htmx_with_the_fragment(people):
    effect = make_effect()
    other = make_effect(step="other")
    client = client_for(people["operator"])

    response = client.post(
        reverse("console:effect_resolve", args=[effect.id]),
        {"outcome": "failed", "note": "provider support: declined, ticket 42", "expected": "UNKNOWN"},
        HTTP_HX_REQUEST="true",
    )
    body = text(response)
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="live-effects_queue"')
    assert "<html" not in body and "resolved as failed" in body
    assert f'id="effect-{other.id}"' in body and f'id="effect-{effect.id}"' not in body

    refused = client.post(reverse("console:effect_resolve", args=[effect.id]),
                          {"outcome": "failed", "note": "again", "expected": "UNKNOWN"}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 409 and "already resolved by olga" in text(refused)
    assert text(refused).lstrip().startswith('<div id="live-effects_queue"')


def test_it_pages_the_effects_queue_by_keyset_past_a_page(people):
    run = make_run()
    now = timezone.now()
    EffectRecord.objects.bulk_create([
        EffectRecord(tenant="default", idempotency_key=f"bulk-{i}", run_id=run.id, step_name=f"s{i}",
                     connector="qp.blind", request_payload={}, payload_hash="0", status=EffectStatus.UNKNOWN,
                     intent_at=now - timedelta(minutes=200 - i))
        for i in range(53)
    ])
    client = client_for(people["viewer"])
    first = text(client.get(reverse("console:effects")))
    ids = re.findall(r'id="effect-(\d+)"', first)
    assert len(ids) == 50 and "53" in first
    cursor = re.search(r'\?after=([0-9_]+)" rel="next"', first).group(1)
    second = text(client.get(reverse("console:effects") + f"?after={cursor}"))
    more = re.findall(r'id="effect-(\d+)"', second)
    assert len(more) == 3 and not set(ids) & set(more)
    steps = [int(s) for s in re.findall(r"step <strong>s(\d+)</strong>", first + second)]
    assert steps == list(range(53))
    assert client.get(reverse("console:effects") + "?after=bogus").status_code == 400


def test_it_escapes_hostile_payload_text_everywhere(people):
    effect = make_effect(error_message=f"provider said {HOSTILE}", request_payload={"note": HOSTILE})
    make_approval(reason=f"ship {HOSTILE}")
    AuditEntry.objects.create(actor_label="olga", action="effect.resolve", object_type="effect",
                              object_id=str(effect.id), outcome=AuditOutcome.OK, reason=HOSTILE,
                              before={"state": HOSTILE}, after={"state": "SUCCEEDED"})
    client = client_for(people["operator"])
    for name in ("effects", "approvals", "audit"):
        page = text(client.get(reverse(f"console:{name}")))
        assert ESCAPED in page, name
        assert HOSTILE not in page, name


# --- approvals ----------------------------------------------------------------------------------


def test_it_lists_open_approvals_soonest_deadline_first_with_a_countdown(people):
    later = make_approval(deadline_in=timedelta(hours=3), step="later")
    sooner = make_approval(deadline_in=timedelta(minutes=30), step="sooner")
    escalated = make_approval(deadline_in=-timedelta(minutes=10), step="escalated", state=ApprovalState.ESCALATED,
                              run=make_run(status=RunStatus.NEEDS_ATTENTION, reason="approval_escalated"))
    finished = make_approval(step="finished", run=make_run(status=RunStatus.CANCELLED, reason=""))
    decided = make_approval(step="decided", state=ApprovalState.APPROVED, decided_by_label="abe",
                            decided_at=timezone.now(), comment="looks right")

    page = text(client_for(people["approver"]).get(reverse("console:approvals")))

    inbox = page.split("Recently decided")[0]
    assert re.findall(r'id="approval-(\d+)"', inbox) == [str(escalated.id), str(sooner.id), str(later.id)]
    assert f'id="approval-{finished.id}"' not in page
    assert f'id="approval-{decided.id}"' in page.split("Recently decided")[1] and "looks right" in page
    assert "ESCALATED" in inbox and "overdue by 10m" in inbox
    assert re.search(r'data-deadline="[^"]+">29m \d+s left<', inbox)
    assert f'href="/runs/{later.run_id}/"' in inbox
    assert "console/countdown.js" in page
    assert inbox.count('value="approve"') == 3 and inbox.count('value="reject"') == 3


def test_it_approves_as_approver_and_wakes_the_run(people):
    run = start("qp_ship", {"id": "o-7"}, started_by=people["operator"])
    advance(str(run.id), owner="test-worker")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    approval = ApprovalRequest.objects.get(run=run)
    client = client_for(people["approver"])
    assert "Irreversible: ship order o-7" in text(client.get(reverse("console:approvals")))

    response = client.post(reverse("console:approval_decide", args=[approval.id]),
                           {"decision": "approve", "comment": "checked the address", "expected": "PENDING"})

    assert response.status_code == 302 and response["Location"] == reverse("console:approvals")
    page = text(client.get(response["Location"]))
    assert "Approved “ship”" in page
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.state == ApprovalState.APPROVED and approval.decided_by == people["approver"]
    assert approval.comment == "checked the address"
    assert run.status == RunStatus.PENDING
    assert JournalEntry.objects.filter(run=run, kind="approval_decided").exists()
    entry = AuditEntry.objects.get(action="approval.approve")
    assert entry.outcome == AuditOutcome.OK and entry.before["state"] == "PENDING"
    assert entry.after["state"] == "APPROVED"


def test_it_refuses_the_runs_starter_four_eyes(people):
    approval = make_approval(run=make_run(status=RunStatus.WAITING, reason="", started_by=people["approver"]))
    client = client_for(people["approver"])
    page = text(client.get(reverse("console:approvals")))
    assert "You started this run and cannot approve its steps" in page
    assert 'value="approve"' not in page

    response = client.post(reverse("console:approval_decide", args=[approval.id]),
                           {"decision": "approve", "expected": "PENDING"})
    assert response.status_code == 409
    assert "ann started this run and cannot approve its steps" in text(response)
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING
    assert AuditEntry.objects.get().outcome == AuditOutcome.REFUSED


def test_it_refuses_a_double_decision_with_who_and_when(people):
    approval = make_approval()
    assert client_for(people["approver"]).post(reverse("console:approval_decide", args=[approval.id]),
                                               {"decision": "approve", "expected": "PENDING"}).status_code == 302
    approval.refresh_from_db()

    response = client_for(people["approver2"]).post(reverse("console:approval_decide", args=[approval.id]),
                                                    {"decision": "reject", "expected": "PENDING"})

    assert response.status_code == 409
    assert f"already approved by ann at {approval.decided_at:%Y-%m-%d %H:%M:%S} UTC" in text(response)
    approval.refresh_from_db()
    assert approval.state == ApprovalState.APPROVED and approval.decided_by == people["approver"]


def test_it_denies_an_operator_deciding_an_approval(people):
    approval = make_approval()
    response = client_for(people["operator"]).post(reverse("console:approval_decide", args=[approval.id]),
                                                   {"decision": "approve", "expected": "PENDING"})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.state == ApprovalState.PENDING
    assert AuditEntry.objects.get().outcome == AuditOutcome.DENIED
    bad = client_for(people["approver"]).post(reverse("console:approval_decide", args=[approval.id]),
                                              {"decision": "maybe"})
    assert bad.status_code == 400


# --- versions -----------------------------------------------------------------------------------


def test_it_shows_each_version_with_its_hashes_runs_in_flight_workers_and_stranded_runs(people):
    old_hash, new_hash, v2_hash = "1" * 64, "2" * 64, "3" * 64
    for version, h in ((1, old_hash), (1, new_hash), (2, v2_hash)):
        WorkflowVersion.objects.create(name="qp_orders", version=version, definition_hash=h,
                                       source=f"def f():\n    return {version}\n", module="tests.qp")
    for _ in range(2):
        make_run(definition_hash=old_hash, status=RunStatus.WAITING, reason="")
    stranded = make_run(definition_hash=old_hash, status=RunStatus.NEEDS_ATTENTION, reason="version_mismatch")
    make_run(definition_hash=old_hash, status=RunStatus.COMPLETED, reason="")
    make_run(definition_hash=new_hash, status=RunStatus.RUNNING, reason="")
    now = timezone.now()
    WorkerProcess.objects.create(name="worker-a", hostname="h", pid=1, started_at=now, last_seen_at=now,
                                 definitions=[{"name": "qp_orders", "version": 1, "hash": new_hash}])
    WorkerProcess.objects.create(name="worker-dead", hostname="h", pid=2, started_at=now, last_seen_at=now,
                                 stopped_at=now, definitions=[{"name": "qp_orders", "version": 1, "hash": old_hash}])

    page = text(client_for(people["viewer"]).get(reverse("console:versions")))

    assert "qp_orders" in page and "2 hashes" in page
    rows = {h[:12]: row for row in re.findall(r"<tr.*?</tr>", page, re.S) for h in (old_hash, new_hash, v2_hash)
            if f">{h[:12]}<" in row}
    assert re.search(r'class="num">3<', rows[old_hash[:12]])  # 2 waiting + 1 stranded; the completed one is not
    assert "none: these runs cannot resume" in rows[old_hash[:12]] and "worker-dead" not in page
    assert re.search(r'class="num">1<', rows[new_hash[:12]]) and "worker-a" in rows[new_hash[:12]]
    assert re.search(r'class="num">0<', rows[v2_hash[:12]])
    assert f'href="/runs/{stranded.id}/"' in page


def test_it_diffs_two_versions_of_a_workflow_with_the_changed_line_escaped(people):
    a = WorkflowVersion.objects.create(name="qp_orders", version=1, definition_hash="1" * 64, module="m",
                                       source='def f(ctx):\n    ctx.step("plan")\n    return "ok"\n')
    b = WorkflowVersion.objects.create(name="qp_orders", version=2, definition_hash="2" * 64, module="m",
                                       source=f'def f(ctx):\n    ctx.step("plan")\n    return "{HOSTILE}"\n')
    other = WorkflowVersion.objects.create(name="qp_other", version=1, definition_hash="9" * 64, module="m",
                                           source="x\n")
    client = client_for(people["viewer"])

    page = text(client.get(reverse("console:version_diff") + f"?a={a.id}&b={b.id}"))

    assert '<span class="diff-line removed">-    return &quot;ok&quot;</span>' in page
    assert f'<span class="diff-line added">+    return &quot;{ESCAPED}&quot;</span>' in page
    assert '<span class="diff-line context">     ctx.step(&quot;plan&quot;)</span>' in page
    assert HOSTILE not in page
    assert client.get(reverse("console:version_diff") + f"?a={a.id}&b={other.id}").status_code == 400
    assert client.get(reverse("console:version_diff") + f"?a={a.id}&b=999999").status_code == 404
    versions_page = text(client.get(reverse("console:versions")))
    assert reverse("console:version_diff") in versions_page and f'<option value="{b.id}"' in versions_page


# --- audit log ----------------------------------------------------------------------------------


def audit(**fields) -> AuditEntry:
    values = {"actor_label": "olga", "action": "effect.resolve", "object_type": "effect", "object_id": "1",
              "outcome": AuditOutcome.OK}
    values.update(fields)
    return AuditEntry.objects.create(**values)


def test_it_filters_the_audit_log(people):
    a = audit(reason="evidence one")
    b = audit(actor_label="vera", outcome=AuditOutcome.DENIED, message="role operator required")
    c = audit(actor_label="ann", action="approval.approve", object_type="approval", object_id="7")
    client = client_for(people["viewer"])

    def shown(**query) -> list[str]:
        response = client.get(reverse("console:audit"), query)
        assert response.status_code == 200
        return re.findall(r'id="audit-(\d+)"', text(response))

    assert shown() == [str(c.id), str(b.id), str(a.id)]
    assert shown(actor="vera") == [str(b.id)]
    assert shown(outcome="denied") == [str(b.id)]
    assert shown(action="approval.approve") == [str(c.id)]
    assert shown(object_type="effect", object_id="1") == [str(b.id), str(a.id)]
    since = (timezone.now() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    before = (timezone.now() - timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%S")
    assert shown(since=since) == [str(c.id), str(b.id), str(a.id)]
    assert shown(until=before) == []
    bad = client.get(reverse("console:audit"), {"since": "yesterday-ish"})
    assert bad.status_code == 400 and "Enter a valid date/time" in text(bad)
    page = text(client.get(reverse("console:audit"), {"actor": "olga"}))
    assert "evidence one" in page and "/audit.csv?actor=olga" in page


def test_it_pages_the_audit_log_newest_first_by_keyset(people):
    AuditEntry.objects.bulk_create([
        AuditEntry(actor_label="olga", action="run.retry", object_type="run", object_id=str(i), outcome="ok")
        for i in range(80)
    ])
    client = client_for(people["viewer"])
    first = text(client.get(reverse("console:audit"), {"action": "run.retry"}))
    ids = [int(i) for i in re.findall(r'id="audit-(\d+)"', first)]
    assert len(ids) == 50 and ids == sorted(ids, reverse=True)
    next_url = re.search(r'href="([^"]+)" rel="next"', first).group(1).replace("&amp;", "&")
    assert "action=run.retry" in next_url
    second = [int(i) for i in re.findall(r'id="audit-(\d+)"', text(client.get(next_url)))]
    assert len(second) == 30 and max(second) < min(ids)


def test_it_exports_the_filtered_audit_log_as_csv(people):
    audit(reason="=HYPERLINK(\"http://evil\")", before={"state": "UNKNOWN", "card_number": "4111"},
          after={"state": "SUCCEEDED"})
    audit(actor_label="vera", outcome=AuditOutcome.DENIED)
    AuditEntry.objects.bulk_create([
        AuditEntry(actor_label="olga", action="run.retry", object_type="run", object_id=str(i), outcome="ok")
        for i in range(2500)
    ])
    client = client_for(people["viewer"])

    response = client.get(reverse("console:audit_csv"), {"actor": "olga", "action": "effect.resolve"})

    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 1
    row = rows[0]
    assert (row["actor"], row["action"], row["outcome"], row["object_id"]) == ("olga", "effect.resolve", "ok", "1")
    assert row["reason"] == "'=HYPERLINK(\"http://evil\")"  # a spreadsheet shows it, never runs it
    assert '"state": "UNKNOWN"' in row["before"] and "4111" not in row["before"]

    everything = client.get(reverse("console:audit_csv"))
    all_rows = list(csv.reader(io.StringIO(b"".join(everything.streaming_content).decode())))
    assert len(all_rows) == 1 + 2502  # header, then every entry: more than one chunk, no row limit
    assert client.get(reverse("console:audit_csv"), {"outcome": "nope"}).status_code == 400


def test_it_offers_no_way_to_change_an_audit_entry(people):
    entry = audit()
    client = client_for(people["operator"])
    assert client.post(reverse("console:audit"), {"id": entry.id}).status_code == 405
    assert client.post(reverse("console:audit_csv")).status_code == 405


# --- live regions -------------------------------------------------------------------------------


def test_it_registers_a_live_fragment_for_each_page(people):
    make_effect()
    make_approval()
    client = client_for(people["operator"])
    for page, fragment in (("effects", "effects_queue"), ("approvals", "approvals_inbox"),
                           ("versions", "versions_list"), ("audit", "audit_log")):
        body = text(client.get(reverse(f"console:{page}")))
        assert f"fragments={fragment}" in body, page
        assert body.count(f'id="live-{fragment}"') == 1, page
        pushed = live.render_fragment(fragment, people["operator"], {})
        assert pushed.count(f'<div id="live-{fragment}"') == 1, page
    pushed = live.render_fragment("effects_queue", people["viewer"], {})
    assert "Record resolution" not in pushed  # the viewer's push shows no actions either


def test_it_streams_the_csv_under_asgi_as_well(people):
    """Under daphne (ASGI) a synchronous body would be collected whole before sending."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    audit(reason="one")
    audit(reason="two", actor_label="vera")
    client = AsyncClient()

    async def fetch() -> tuple[int, bool, bool, str]:
        await client.aforce_login(people["viewer"])
        response = await client.get(reverse("console:audit_csv"), {"actor": "olga"})
        chunks = [chunk async for chunk in response.streaming_content]
        return response.status_code, response.streaming, response.is_async, b"".join(chunks).decode()

    status, streaming, is_async, body = async_to_sync(fetch)()
    assert status == 200 and streaming and is_async
    rows = list(csv.DictReader(io.StringIO(body)))
    assert [r["reason"] for r in rows] == ["one"]
