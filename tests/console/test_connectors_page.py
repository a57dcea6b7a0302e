"""The connectors page: each connector's flow control as an operator reads it, the operator's
actions on it (pause, resume, limits, back to the declared defaults) with their audit entries
and refusals, its live updates, and the run page's line saying what a held run waits for."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.utils import timezone

from config.asgi import application
from console import broadcast as live_broadcast
from console import live, topics
from ledger.flow import services as flow
from ledger.models import (
    CircuitChange,
    CircuitState,
    ConnectorFlow,
    EffectStatus,
    FlowBucket,
    FlowTicket,
    HoldReason,
    TicketState,
)
from ledger.signals import send_circuit_changed, send_tickets_granted
from operators.models import AuditEntry, AuditOutcome, TenantScope
from operators.services.actions import Actor
from operators.services.connectors import connector_limits_act, connector_pause_act
from sagas.models import RunStatus
from tests.console.conftest import client_for
from tests.console.queue_data import ESCAPED, HOSTILE, make_effect, make_run, text

pytestmark = pytest.mark.django_db

PAGE = "/connectors/"
HANG = 60.0  # only a guard against a real hang: a push that is due is waited for this long
DECLARED = {"rate": 5.0, "burst": 10, "max_in_flight": 4, "key_field": "tenant", "circuit_failures": 5,
            "circuit_window_seconds": 60.0, "circuit_cooldown_seconds": 30.0}


def make_flow(name: str = "payments.capture", **changes) -> ConnectorFlow:
    """A connector's flow row as a worker writes it at start-up (its declared limits), with ``changes``."""
    return ConnectorFlow.objects.create(connector=name, declared=DECLARED, **{**DECLARED, **changes})


def row_of(page: str, name: str) -> str:
    found = re.search(rf'<tr class="connector[^"]*" data-connector="{re.escape(name)}">.*?</tr>', page, re.S)
    assert found, f"no row for {name}"
    return found.group(0)


def section_of(page: str, name: str) -> str:
    anchor = "connector-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
    found = re.search(rf'<section class="connector-detail" id="{anchor}".*?</section>', page, re.S)
    assert found, f"no section for {name}"
    return found.group(0)


def flow_of(name: str = "payments.capture") -> ConnectorFlow:
    return ConnectorFlow.objects.get(connector=name)


def expected_of(page: str, name: str, action: str) -> str:
    """The ``expected`` the page's form for ``action`` carries (what the person saw)."""
    form = re.search(rf'action="/connectors/{action}/".*?</form>', section_of(page, name), re.S)
    assert form, f"no {action} form for {name}"
    return re.search(r'name="expected" value="([^"]*)"', form.group(0)).group(1)


def post(client, action: str, name: str = "payments.capture", **data):
    form = {"connector": name, "reason": "provider incident INC-42",
            "expected": "paused" if action == "resume" else "running"}
    form.update(data)
    return client.post(f"/connectors/{action}/", form)


def limits_form(**changes) -> dict:
    form = {"rate": "2.5", "burst": "3", "max_in_flight": "2", "key_field": "", "circuit_failures": "3",
            "circuit_window_seconds": "30", "circuit_cooldown_seconds": "15", "reason": "provider asked us to slow down"}
    form.update(changes)
    return form


def audits(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action, object_type="connector").order_by("id"))


def test_it_lists_each_connector_with_its_limits_pause_traffic_circuit_and_latency(people):
    now = timezone.now()
    make_flow("payments.capture", rate=2.5, burst=3, changed_by_label="olga", changed_at=now - timedelta(minutes=3),
              paused_at=now - timedelta(minutes=2), paused_by_label="oscar", paused_reason="provider incident INC-42")
    make_flow("email.send", rate=None, max_in_flight=None, key_field="")
    FlowBucket.objects.create(connector="payments.capture", key="acme", circuit=CircuitState.OPEN, failures=5,
                              opened_at=now - timedelta(seconds=40))
    CircuitChange.objects.create(connector="payments.capture", key="acme", state=CircuitState.OPEN, failures=5,
                                 error="503 from the provider", at=now - timedelta(seconds=40))
    CircuitChange.objects.create(connector="payments.capture", key="acme", state=CircuitState.CLOSED,
                                 at=now - timedelta(hours=1))
    run = make_run(status=RunStatus.WAITING, reason="")
    for i, state in enumerate([TicketState.WAITING, TicketState.WAITING, TicketState.GRANTED]):
        effect = make_effect(run=run, connector="payments.capture", status=EffectStatus.PENDING, step=f"pay-{i}")
        FlowTicket.objects.create(effect=effect, run_id=run.id, connector="payments.capture", key="acme", tag=i + 1,
                                  reason=HoldReason.PAUSED, state=state, created_at=now)
    make_effect(run=run, connector="payments.capture", status=EffectStatus.IN_PROGRESS, age=timedelta(seconds=1))
    # Four calls ended in the last 5 minutes (one failed for good), 100/200/300/400 ms; one long ago.
    for i, status in enumerate([EffectStatus.SUCCEEDED] * 3 + [EffectStatus.FAILED_FINAL]):
        dispatched = now - timedelta(minutes=1)
        make_effect(run=run, connector="payments.capture", status=status, dispatched_at=dispatched,
                    completed_at=dispatched + timedelta(milliseconds=100 * (i + 1)))
    make_effect(run=run, connector="payments.capture", status=EffectStatus.SUCCEEDED,
                dispatched_at=now - timedelta(hours=2), completed_at=now - timedelta(hours=2))

    page = text(client_for(people["viewer"]).get(PAGE))

    assert '<a href="/connectors/" aria-current="page">Connectors</a>' in page  # in the nav
    paid = row_of(page, "payments.capture")
    assert 'class="badge PAUSED">paused</span> by <bdi>oscar</bdi>' in paid and "provider incident INC-42" in paid
    assert "2.5 calls/s, burst 3" in paid and "at most 4 in flight" in paid and "kept per tenant" in paid
    assert "changed</span> by <bdi>olga</bdi>" in paid
    assert [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', paid)] == [1, 2, 1]  # in flight, waiting, let go
    assert 'class="badge circuit-open">open</span>' in paid and "5 failures" in paid
    assert "4 calls ended, 25.0 % failed" in paid and "p50 250.0 ms" in paid and "p95 385.0 ms" in paid
    mail = row_of(page, "email.send")
    assert "flow-running" in mail and "no rate limit" in mail and "no in-flight limit" in mail
    assert "declared defaults" in mail and "one set for the whole connector" in mail and "no call ended" in mail
    timeline = section_of(page, "payments.capture")
    assert timeline.index("503 from the provider") < timeline.index("closed: calls go through")  # newest first
    assert "Declared by its code</dt><dd>5 calls/s, burst 10" in timeline
    assert "has been closed all along" in section_of(page, "email.send")
    assert "<form" not in page.split('id="live-connectors_list"')[1]  # a viewer reads; no form


def test_it_lets_an_operator_pause_and_resume_a_connector_each_audited(people):
    make_flow()
    client = client_for(people["operator"])
    page = text(client.get(PAGE))
    assert expected_of(page, "payments.capture", "pause") == "running"

    answer = post(client, "pause", expected=expected_of(page, "payments.capture", "pause"))
    assert answer.status_code == 302 and answer.url == f"{PAGE}#connector-payments-capture"
    flow_row = flow_of()
    assert flow_row.paused_at is not None
    assert (flow_row.paused_by_label, flow_row.paused_reason) == ("olga", "provider incident INC-42")
    [paused] = audits("connector.pause")
    assert (paused.outcome, paused.object_id, paused.reason) == (AuditOutcome.OK, "payments.capture",
                                                                 "provider incident INC-42")
    assert (paused.before["state"], paused.after["state"]) == ("running", "paused")
    shown = text(client.get(PAGE))
    assert "payments.capture paused" in shown  # the message
    assert 'class="badge PAUSED">paused</span> by <bdi>olga</bdi>' in row_of(shown, "payments.capture")
    assert expected_of(shown, "payments.capture", "resume") == "paused"

    assert post(client, "resume", reason="provider is back").status_code == 302
    assert flow_of().paused_at is None
    [resumed] = audits("connector.resume")
    assert (resumed.outcome, resumed.before["state"], resumed.after["state"]) == (AuditOutcome.OK, "paused",
                                                                                  "running")


def test_it_lets_an_operator_change_the_limits_and_go_back_to_the_declared_defaults(people):
    make_flow()
    client = client_for(people["operator"])
    seen = expected_of(text(client.get(PAGE)), "payments.capture", "limits")
    assert re.fullmatch(r"running [0-9a-f]{12}", seen)

    assert client.post("/connectors/limits/", {"connector": "payments.capture", "expected": seen,
                                               **limits_form()}).status_code == 302
    row = flow_of()
    assert (row.rate, row.burst, row.max_in_flight, row.key_field) == (2.5, 3, 2, "")
    assert (row.circuit_failures, row.circuit_window_seconds, row.circuit_cooldown_seconds) == (3, 30.0, 15.0)
    assert row.changed_by_label == "olga" and row.changed_at is not None
    [changed] = audits("connector.limits")
    assert changed.outcome == AuditOutcome.OK and changed.reason == "provider asked us to slow down"
    assert (changed.before["limits"]["rate"], changed.after["limits"]["rate"]) == (5.0, 2.5)
    page = text(client.get(PAGE))
    assert "changed</span> by <bdi>olga</bdi>" in row_of(page, "payments.capture")

    back = expected_of(page, "payments.capture", "limits")
    assert back != seen
    answer = client.post("/connectors/limits/", {"connector": "payments.capture", "expected": back, "declared": "1",
                                                  "reason": "incident over"})
    assert answer.status_code == 302
    row = flow_of()
    assert (row.rate, row.burst, row.max_in_flight, row.key_field, row.changed_by_label) == (5.0, 10, 4, "tenant", "")
    assert [a.outcome for a in audits("connector.limits")] == [AuditOutcome.OK, AuditOutcome.OK]
    assert "declared defaults" in row_of(text(client.get(PAGE)), "payments.capture")


def test_it_refuses_a_viewer_and_an_operator_of_some_tenants_with_403_audited_and_nothing_changed(people):
    make_flow()
    viewer = client_for(people["viewer"])
    for action in ("pause", "limits"):
        answer = post(viewer, action, **(limits_form() if action == "limits" else {}))
        assert answer.status_code == 403
    limited = people["operator2"]
    TenantScope.objects.create(user=limited, tenants=["acme"])
    assert "<form" not in text(client_for(limited).get(PAGE)).split('id="live-connectors_list"')[1]
    assert post(client_for(limited), "pause").status_code == 403
    assert post(client_for(people["nobody"]), "pause").status_code == 403

    row = flow_of()
    assert row.paused_at is None and (row.rate, row.burst, row.changed_by_label) == (5.0, 10, "")
    denied = audits("connector.pause") + audits("connector.limits")
    assert sorted(a.actor_label for a in denied) == ["nils", "oscar", "vera", "vera"]
    assert {a.outcome for a in denied} == {AuditOutcome.DENIED}


def test_it_refuses_a_stale_page_and_a_double_submit_with_409_and_applies_each_once(people):
    make_flow()
    first, second = client_for(people["operator"]), client_for(people["operator2"])
    page = text(first.get(PAGE))  # both people loaded the page while the connector ran
    limits_seen = expected_of(page, "payments.capture", "limits")

    assert post(first, "pause").status_code == 302
    again = post(first, "pause")  # the same form sent twice
    assert again.status_code == 409 and "is now paused by olga" in text(again)
    late = post(second, "pause")
    assert late.status_code == 409 and "nothing was changed" in text(late)
    assert [a.outcome for a in audits("connector.pause")] == [AuditOutcome.OK, AuditOutcome.REFUSED,
                                                             AuditOutcome.REFUSED]
    assert flow_of().paused_by_label == "olga"
    # A limits form from before the pause: refused, the limits stay.
    stale = second.post("/connectors/limits/", {"connector": "payments.capture", "expected": limits_seen,
                                                **limits_form()})
    assert stale.status_code == 409 and "is now paused" in text(stale)
    assert flow_of().rate == 5.0

    assert post(first, "resume").status_code == 302
    seen = expected_of(text(first.get(PAGE)), "payments.capture", "limits")
    form = {"connector": "payments.capture", "expected": seen, **limits_form()}
    assert first.post("/connectors/limits/", form).status_code == 302
    changed_at = flow_of().changed_at
    twice = first.post("/connectors/limits/", form)  # a double submit of one limits form
    assert twice.status_code == 409 and "limits were changed by olga" in text(twice)
    other = second.post("/connectors/limits/", {**form, "rate": "9"})  # someone else, from the same page
    assert other.status_code == 409
    row = flow_of()
    assert (row.rate, row.changed_at) == (2.5, changed_at)
    assert [a.outcome for a in audits("connector.limits")] == [AuditOutcome.REFUSED, AuditOutcome.OK,
                                                              AuditOutcome.REFUSED, AuditOutcome.REFUSED]


@pytest.mark.parametrize(("changes", "says"), [
    ({"rate": "fast"}, "Rate (calls per second) must be a number"),
    ({"rate": "0"}, "Rate (calls per second) must be between 0.001 and"),
    ({"rate": "nan"}, "Rate (calls per second) must be a number"),
    ({"burst": "0"}, "Burst must be between 1 and"),
    ({"burst": "2.5"}, "Burst must be a whole number"),
    ({"burst": ""}, "Burst is required"),
    ({"max_in_flight": "-3"}, "Calls in flight must be between 1 and"),
    ({"circuit_failures": "many"}, "Failures that open the circuit must be a whole number"),
    ({"circuit_window_seconds": "0"}, "The circuit&#x27;s window (seconds) must be between 0.1 and"),
    ({"circuit_cooldown_seconds": "1e9"}, "The circuit&#x27;s cool-down (seconds) must be between 0.1 and"),
    ({"key_field": "tenant; DROP TABLE"}, "The limit key must be empty"),
    ({"key_field": "k" * 101}, "Limit key is longer than 100 characters"),
    ({"reason": ""}, "A reason is required"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_it_answers_malformed_or_out_of_range_limits_with_400_naming_the_field(people, changes, says):
    make_flow()
    client = client_for(people["operator"])
    seen = expected_of(text(client.get(PAGE)), "payments.capture", "limits")

    answer = client.post("/connectors/limits/", {"connector": "payments.capture", "expected": seen,
                                                 **limits_form(**changes)})

    assert answer.status_code == 400
    assert says in text(answer) and "nothing was changed" in text(answer).lower()
    row = flow_of()
    assert (row.rate, row.burst, row.max_in_flight, row.key_field, row.circuit_window_seconds) == (
        5.0, 10, 4, "tenant", 60.0)
    assert row.changed_by_label == "" and not audits("connector.limits")


def test_it_shows_a_pause_reason_with_hostile_html_as_text(people):
    make_flow()
    client = client_for(people["operator"])
    assert post(client, "pause", reason=f"provider {HOSTILE} down").status_code == 302

    page = text(client.get(PAGE))
    fragment = live.FRAGMENTS["connectors_list"].render(people["viewer"], {})

    for html in (page, fragment):
        assert f"provider {ESCAPED} down" in html and HOSTILE not in html
    assert HOSTILE in audits("connector.pause")[0].reason  # stored as given, shown as text


def test_it_shows_what_a_held_run_waits_for_on_its_run_page_and_in_its_live_header(people):
    make_flow()
    now = timezone.now()
    ahead, held = make_run(status=RunStatus.WAITING, reason=""), make_run(status=RunStatus.WAITING, reason="")
    for tag, run in ((1, ahead), (2, held)):
        effect = make_effect(run=run, connector="payments.capture", status=EffectStatus.PENDING, step="capture")
        FlowTicket.objects.create(effect=effect, run_id=run.id, connector="payments.capture", key="", tag=tag,
                                  reason=HoldReason.RATE, created_at=now)
    client = client_for(people["viewer"])

    page = text(client.get(f"/runs/{held.id}/"))
    header = live.FRAGMENTS["run_header"].render(people["viewer"], {"run": str(held.id)})

    for html in (page, header):
        assert "waiting for payments.capture (rate limit, position 2)" in html
        assert 'href="/connectors/#connector-payments-capture"' in html
    FlowTicket.objects.filter(run_id=ahead.id).delete()  # the call ahead went
    assert "waiting for payments.capture (rate limit, position 1)" in live.FRAGMENTS["run_header"].render(
        people["viewer"], {"run": str(held.id)})
    FlowTicket.objects.all().delete()  # its call went too
    assert "waiting for" not in text(client.get(f"/runs/{held.id}/"))


def test_it_follows_the_connectors_topic_which_circuits_and_operator_changes_publish(
        people, monkeypatch, django_capture_on_commit_callbacks):
    assert live.topics_for("connectors_list", {}) == [topics.CONNECTORS]
    published: list[tuple[str, ...]] = []
    monkeypatch.setattr(live_broadcast, "broadcast", lambda *t: published.append(t))
    make_flow()

    with django_capture_on_commit_callbacks(execute=True):
        connector_pause_act(Actor(user=people["operator"], ip=None), name="payments.capture", reason="incident",
                            expected="running")
        send_circuit_changed(connector="payments.capture", key="", state="open", failures=5, error="503")
        send_tickets_granted(runs=[])  # counts, which the page polls for: no push

    assert [t for t in published if topics.CONNECTORS in t] == [(topics.AUDIT, topics.CONNECTORS), (topics.CONNECTORS,)]


@pytest.mark.django_db(transaction=True)
def test_it_pushes_a_pause_to_an_open_connectors_page(people):
    """Over the real channel layer and ASGI app: a page open on the connectors list hears of a
    pause made elsewhere (here through the operator service, as the HTTP API does)."""
    make_flow()
    viewer = Client()
    viewer.force_login(people["viewer"])
    cookie = f"{settings.SESSION_COOKIE_NAME}={viewer.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    assert live_broadcast.publisher.flush()  # what was published before is out before the socket joins

    async def scenario() -> str:
        socket = WebsocketCommunicator(application, "/ws/live/?fragments=connectors_list",
                                       headers=[(b"origin", b"http://localhost"), (b"cookie", cookie)])
        connected, _ = await socket.connect(timeout=HANG)
        assert connected
        assert "flow-running" in await socket.receive_from(timeout=HANG)  # the catch-up push
        await database_sync_to_async(connector_pause_act)(
            Actor(user=people["operator"], ip=None), name="payments.capture", reason="relay down", expected="running")
        while "relay down" not in (pushed := await socket.receive_from(timeout=HANG)):
            pass
        await socket.disconnect()
        return pushed

    pushed = async_to_sync(scenario)()
    assert 'class="badge PAUSED">paused</span> by <bdi>olga</bdi>' in pushed and "<form" not in pushed


def test_a_limit_set_through_the_service_with_only_the_state_still_applies(people):
    """The limits' version is optional in ``expected`` (the HTTP API sends the state alone)."""
    make_flow()

    connector_limits_act(Actor(user=people["operator"], ip=None), name="payments.capture", reason="slow down",
                         limits=flow.Limits(**{**DECLARED, "rate": 1.0}), expected="running")
    assert flow_of().rate == 1.0


def test_it_answers_an_htmx_action_with_the_region_and_the_result_as_a_message(people):
    """With JavaScript the forms post through htmx (its CSRF header survives the pushes that
    re-render the forms): the answer is the region as it is now, and the result out of band."""
    make_flow()
    client = client_for(people["operator"])

    done = client.post("/connectors/pause/", {"connector": "payments.capture", "reason": "relay down",
                                              "expected": "running"}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200
    html = text(done)
    assert 'id="live-connectors_list"' in html and "<html" not in html
    assert "hx-swap-oob" in html and "payments.capture paused" in html
    assert 'class="badge PAUSED">paused</span> by <bdi>olga</bdi>' in row_of(html, "payments.capture")

    again = client.post("/connectors/pause/", {"connector": "payments.capture", "reason": "relay down",
                                               "expected": "running"}, HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "is now paused by olga" in text(again) and "<html" not in text(again)
    bad = client.post("/connectors/limits/", {"connector": "payments.capture", "expected": "paused",
                                              **limits_form(burst="none")}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "Burst must be a whole number" in text(bad)
    assert [a.outcome for a in audits("connector.pause")] == [AuditOutcome.OK, AuditOutcome.REFUSED]
