"""The ambiguous-effects queue: what it lists, asking the provider, resolving by hand with
evidence, who may do what, and paging."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from console.user_audit import ACTION as ROLE_CHANGES  # the fixture's role grants
from ledger.models import EffectRecord, EffectStatus
from ledger.outcomes import NotExecuted, Succeeded, Unknown
from operators.models import AuditEntry, AuditOutcome
from sagas.models import (
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from tests.console.conftest import client_for
from tests.console.queue_data import (
    LookupConnector,
    make_effect,
    make_run,
    resolve,
    text,
)

pytestmark = pytest.mark.django_db


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
    assert list(AuditEntry.objects.exclude(action=ROLE_CHANGES).values_list("outcome", flat=True)) == [
        AuditOutcome.REFUSED]


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
    entry = AuditEntry.objects.exclude(action=ROLE_CHANGES).get()
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
    steps = [int(s) for s in re.findall(r"step <strong><bdi>s(\d+)</bdi></strong>", first + second)]
    assert steps == list(range(53))
    assert client.get(reverse("console:effects") + "?after=bogus").status_code == 400
