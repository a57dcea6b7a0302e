"""The shortcuts the list pages render their rows with write exactly what Django's own tags and
filters wrote before them: the moments (``|stamp``, ``|iso_time`` against ``|date``), the row
forms' hidden inputs (``{% form_state %}`` against ``{% csrf_token %}`` and two inputs), and the
previews (escaped: hostile text stays text), and the rows built in Python (``{% history_entry %}``,
``{% effect_row %}``, ``{% approval_row %}``) against the template text that wrote them before,
kept here as it was."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.middleware.csrf import get_token
from django.template import Context, Template
from django.test import RequestFactory
from django.urls import reverse

from console.forms_queues import EffectFilterForm
from console.selectors.history import Pair, TimelineRow
from console.templatetags.ages import iso_time, stamp
from console.templatetags.payloads import PREVIEW_CHARS, long_text, payload
from console.views.queues import _approvals_context, _effects_context
from ledger.models import EffectStatus
from operators import roles
from sagas.models import ApprovalState, RunStatus
from tests.console.queue_data import make_approval, make_effect, make_run

HOSTILE = "<script>alert(1)</script>&\"'"


def render(source: str, **context) -> str:
    return Template(source).render(Context(context))


def test_moments_read_as_djangos_date_filter_wrote_them():
    for moment in (datetime(2026, 12, 5, 13, 20, 7, 123456, tzinfo=UTC),
                   datetime(2026, 3, 29, 1, 59, 59, tzinfo=timezone(timedelta(hours=-7))),
                   datetime(2025, 1, 1, 0, 0, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))):
        assert stamp(moment) == render('{{ m|date:"Y-m-d H:i:s" }}', m=moment)
        assert iso_time(moment) == render("{{ m|date:'c' }}", m=moment)
    assert stamp(None) == "" == iso_time(None) == render('{{ m|date:"Y-m-d H:i:s" }}', m=None)


def test_the_row_forms_state_is_the_csrf_input_and_the_pages_position():
    request = RequestFactory().get("/")
    token = get_token(request)
    ours = Template('{% load rowforms %}{% form_state after=a filters=f as s %}{{ s }}').render(
        Context({"csrf_token": token, "a": '1_2"><b>', "f": "q=<i>"}))
    theirs = Template('{% csrf_token %}\n<input type="hidden" name="after" value="{{ a }}">\n'
                      '<input type="hidden" name="filters" value="{{ f }}">').render(
        Context({"csrf_token": token, "a": '1_2"><b>', "f": "q=<i>"}))
    assert ours == theirs
    # A live push renders without a request: no token, as {% if csrf_token %} left it out.
    assert Template("{% load rowforms %}{% form_state as s %}[{{ s }}]").render(Context({})) == "[]"


def test_previews_escape_what_they_show_and_say_how_much_is_cut():
    short = payload({"note": HOSTILE}, "/p/1/")
    assert "<script>" not in short and "&lt;script&gt;" in short and "payload-cut" not in short
    cut = long_text(HOSTILE * 200, "/p/2/")
    assert "<script>" not in cut and f"Showing the first {PREVIEW_CHARS} characters of" in cut
    assert 'hx-get="/p/2/"' in cut and "show all of it" in cut
    assert payload(None, "/p/3/") == "" == long_text(None, "/p/4/")


# templates/console/run_history_entry.html as it was before the rows were built in Python.
HISTORY_ENTRY_TEMPLATE = '{% load ages history %}{% if e.new_day %}<li class="day"><time datetime="{{ e.created_at|date:\'Y-m-d\' }}">{{ e.created_at|date:"l j F Y" }}</time></li>\n{% endif %}<li class="entry kind-{{ e.kind }}" id="seq-{{ e.seq }}"{% if e.pair %} data-pair="{{ e.pair.role }}"{% endif %}>\n  <a class="seq mono" href="#seq-{{ e.seq }}">#{{ e.seq }}</a>\n  <time datetime="{{ e.created_at|iso_time }}" title="{{ e.created_at|full_time }}">{{ e.created_at|clock }}</time>\n  <span class="entry-gap"{% if e.gap is not None %} title="since entry #{{ e.seq|add:\'-1\' }}"{% endif %}>{{ e.gap|gap }}</span>\n  <span class="entry-kind">{{ e.kind }}</span>\n  <bdi class="entry-name">{{ e.name }}</bdi>\n  <bdi class="entry-worker mono" title="{{ e.worker_id }}">{{ e.worker_id }}</bdi>\n  <span class="entry-pair">{% with pair=e.pair %}{% if pair %}{% if pair.role == "intent" %}→{% else %}↳ of{% endif %}{% if pair.seq %} <a href="{% if pair.on_page %}#seq-{{ pair.seq }}{% else %}{{ e.run_id|history_url }}?seq={{ pair.seq }}{% endif %}" title="{% if pair.role == \'intent\' %}its outcome{% else %}its intent{% endif %}">#{{ pair.seq }}</a>{% endif %} <span class="badge {{ pair.badge }}">{{ pair.status }}</span> <span class="muted">{% if pair.elapsed is not None %}after {{ pair.elapsed|duration }}{% elif pair.role == "intent" %}no outcome yet{% endif %}</span>{% endif %}{% endwith %}</span>\n  {% entry_payload e %}\n  {% with said=e|repair_said %}{% if said %}<bdi class="entry-said">{{ said }}</bdi>{% endif %}{% endwith %}\n</li>\n'


def test_history_rows_are_what_the_entry_template_wrote():
    run = "0b6f2a10-9c1e-4d38-8f27-4a5b6c7d8e9f"
    at = datetime(2026, 12, 5, 23, 59, 58, 345678, tzinfo=UTC)
    rows = []
    for new_day in (True, False):
        for gap in (None, timedelta(milliseconds=50), timedelta(milliseconds=-3), timedelta(minutes=3, seconds=4)):
            rows.append(TimelineRow(run_id=run, seq=7, kind="step", name=HOSTILE, worker_id=HOSTILE, created_at=at,
                                    payload={"note": HOSTILE, "n": 1}, gap=gap, new_day=new_day, pair=None))
    pairs = [Pair("intent", None, "UNKNOWN", None), Pair("intent", 12, "SUCCEEDED", timedelta(seconds=1.25), True),
             Pair("intent", 12, "FAILED_FINAL", timedelta(0), False), Pair("outcome", 3, "APPROVED", None, True),
             Pair("outcome", None, "REJECTED by olga", timedelta(hours=2), False),
             Pair("outcome", 0, HOSTILE, timedelta(days=3), False)]
    rows += [TimelineRow(run_id=run, seq=9, kind="effect_intent", name="capture", worker_id="w-1", created_at=at,
                         payload=None, gap=timedelta(seconds=2), new_day=False, pair=pair) for pair in pairs]
    rows += [TimelineRow(run_id=run, seq=11, kind="moved", name="", worker_id="", created_at=at,
                         payload={"from_version": 1, "to_version": 2, "by": HOSTILE, "reason": HOSTILE},
                         gap=None, new_day=False, pair=None),
             TimelineRow(run_id=run, seq=12, kind="step", name="x" * 300, worker_id="", created_at=at,
                         payload={"text": HOSTILE * 100}, gap=None, new_day=False, pair=None)]
    for row in rows:
        theirs = Template(HISTORY_ENTRY_TEMPLATE).render(Context({"e": row}))
        ours = Template("{% load history %}{% history_entry e %}").render(Context({"e": row}))
        assert ours == theirs, row
        assert "<script>" not in ours
    said = Template("{% load history %}{% history_entry e %}").render(Context({"e": rows[-2]}))
    assert 'class="entry-said"' in said  # the repair sentence is there, escaped


# The loop body of templates/console/effects_live.html before the row was built in Python.
EFFECT_ROW_TEMPLATE = '{% load ages console_tags payloads business %}{% with e=row.effect %}\n      <tr id="effect-{{ e.id }}" class="effect" data-action-row>\n        {% if can_resolve %}<td class="pick"><input type="checkbox" name="ids" value="{{ e.id }}" form="bulk-form" aria-label="{{ row.pick }}"></td>{% endif %}\n        <td>\n          <span class="badge {{ e.status }}">{{ e.status }}</span>{% if e.status == "IN_PROGRESS" %} <span class="badge stuck" title="no worker holds its run">stuck</span>{% endif %}\n          <br><a href="#effect-{{ e.id }}">#{{ e.id }}</a>{% if e.kind == "compensation" %} <span class="badge">compensation</span>{% endif %}\n          <br><span class="muted">intent {{ e.intent_at|stamp }} UTC</span>\n        </td>\n        <td class="business">\n          {% if row.run.business_key %}<bdi class="mono key">{{ row.run.business_key|show_controls }}</bdi><br>{% endif %}<span class="muted">tenant</span> <bdi class="tenant">{{ e.tenant }}</bdi>\n          {% if row.run %}<br>{% run_summary row.run %}{% endif %}\n        </td>\n        <td>\n          <a class="mono" href="{{ root }}runs/{{ e.run_id }}/" title="{{ e.run_id }}">{{ row.short }}…</a>\n          {% if row.run %}<span class="muted"><bdi>{{ row.run.workflow_name }}</bdi> v{{ row.run.version }}</span> <span class="badge {{ row.run.status }}">{{ row.run.status }}</span>{% else %}<span class="muted">run not found</span>{% endif %}\n          <br>step <strong><bdi>{{ e.step_name }}</bdi></strong>\n        </td>\n        <td><bdi>{{ e.connector }}</bdi><br><bdi class="mono key">{{ e.idempotency_key|show_controls }}</bdi>\n          <details class="payload"><summary>request<span class="visually-hidden"> of effect #{{ e.id }}</span></summary>{% payload e.request_payload row.request_url %}</details>\n        </td>\n        <td class="num">{{ e.attempts }}{% if e.checks %}<br><span class="muted">{{ e.checks }} lookup{{ e.checks|pluralize }}</span>{% endif %}</td>\n        <td class="error-cell">{% if e.error_class %}<strong><bdi>{{ e.error_class }}</bdi></strong>\n          {% long_text e.error_message row.error_url %}\n          {% else %}<span class="muted">none recorded</span>{% endif %}\n        </td>\n        <td><span title="since {{ row.unknown_since|stamp }} UTC">{{ row.unknown_for }}</span></td>\n        <td>{% if row.can_lookup %}<span class="yes">yes</span>{% elif row.connector_known %}<span class="muted">no lookup</span>{% else %}<span class="error">connector not registered here</span>{% endif %}</td>\n        <td class="actions">\n          {% if can_query and row.can_lookup %}\n          <form method="post" action="{{ row.query_url }}" hx-post="{{ row.query_url }}"\n                hx-target="#live-effects_queue" hx-swap="outerHTML" data-action-kind="query">{{ state }}\n            <button type="submit" data-row-action="query">Query provider{{ row.target }}</button>\n          </form>\n          {% endif %}\n          {% if can_resolve %}\n          <details class="resolve" id="resolve-{{ e.id }}" hx-preserve="true"><summary data-row-action="resolve">Resolve…{{ row.target }}</summary>\n            <form method="post" action="{{ row.resolve_url }}" hx-post="{{ row.resolve_url }}"\n                  hx-target="#live-effects_queue" hx-swap="outerHTML" class="stacked" data-action-kind="resolve">{{ state }}\n              <input type="hidden" name="expected" value="{{ e.status }}">\n              <label>What happened\n                <select name="outcome" required>\n                  <option value="">choose…</option>\n                  {{ outcome_options }}\n                </select></label>\n              <label>Downstream reference <span class="muted">(required for succeeded)</span>\n                <input name="downstream_ref" maxlength="300" autocomplete="off"></label>\n              <label>Evidence <span class="muted">(required: what you checked, where, ticket)</span>\n                <textarea name="note" rows="3" maxlength="4000" required></textarea></label>\n              <button type="submit" class="primary">Record resolution{{ row.target }}</button>\n            </form>\n          </details>\n          {% endif %}\n          {% if not can_query and not can_resolve %}<span class="muted">operators resolve these</span>{% endif %}\n        </td>\n      </tr>\n    {% endwith %}'


@pytest.mark.django_db
def test_effect_rows_are_what_the_queue_template_wrote(people):
    hostile = HOSTILE + "\u202e"
    run = make_run(name="qp_orders", business_key=hostile, summary={"order": hostile, "amount": "12.00 EUR"})
    make_effect(run=run, connector="qp.lookup", step=hostile, error_class=hostile, error_message=hostile * 200,
                request_payload={"card": "4111111111111111", "note": hostile})
    make_effect(run=run, status=EffectStatus.IN_PROGRESS, kind="compensation", error_class="", error_message="",
                checks=1, step="refund")
    make_effect(run=make_run(business_key=""), connector="qp.blind", checks=3, step="email")
    make_effect(run=run, connector="gone.away", step="ship", idempotency_key=hostile)
    orphan = make_run()
    make_effect(run=orphan, step="lost")
    orphan.delete()  # the effect outlives its run: "run not found"
    context = _effects_context(people["operator"], EffectFilterForm({}))
    rows = context["page"].items
    assert len(rows) == 5
    root = reverse("console:overview")
    for row, can_resolve, can_query in itertools.product(rows, (True, False), (True, False)):
        values = {"row": row, "can_resolve": can_resolve, "can_query": can_query, "root": root,
                  "state": "<input type=hidden name=after value=1_2>", "outcome_options": "<option>x</option>"}
        values["state"] = Template("{{ s|safe }}").render(Context(values))
        theirs = Template(EFFECT_ROW_TEMPLATE).render(Context(values))
        ours = Template("{% load queue_rows %}{% effect_row row can_resolve=can_resolve can_query=can_query "
                        "state=state options=outcome_options root=root %}").render(Context(values))
        assert ours == theirs, (row.effect.step_name, can_resolve, can_query)
        assert "<script>" not in ours
    assert roles.can(people["operator"], "effect.resolve")


APPROVAL_ROW_TEMPLATE = '{% load ages console_tags payloads business %}{% with a=row.a %}\n      <tr id="approval-{{ a.id }}" data-action-row class="approval{% if row.escalated %} escalated{% elif row.overdue %} overdue{% endif %}">\n        {% if can_approve or can_reject %}<td class="pick"><input type="checkbox" name="ids" value="{{ a.id }}" form="bulk-form" aria-label="{{ row.pick }}"></td>{% endif %}\n        <td class="deadline">\n          {% if row.escalated %}<span class="badge ESCALATED">ESCALATED</span><br>{% endif %}\n          <time class="countdown{% if row.overdue %} overdue{% endif %}" datetime="{{ a.deadline|iso_time }}" data-deadline="{{ a.deadline|iso_time }}">{{ row.remaining }}</time>\n          <br><span class="muted">{{ a.deadline|stamp }} UTC</span>\n        </td>\n        <td><strong><bdi>{{ a.step }}</bdi></strong><p class="reason">{% long_text a.reason row.reason_url %}</p></td>\n        <td>\n          <a class="mono" href="{{ root }}runs/{{ a.run_id }}/" title="{{ a.run_id }}">{{ row.short }}…</a>\n          <span class="muted"><bdi>{{ a.run.workflow_name }}</bdi> v{{ a.run.version }}</span> <span class="badge {{ a.run.status }}">{{ a.run.status }}</span>\n          {% if a.run.business_key %}<br><span class="muted">key</span> <bdi class="mono key">{{ a.run.business_key|show_controls }}</bdi>{% endif %}\n          <br><span class="muted">tenant</span> <bdi class="tenant">{{ a.run.tenant }}</bdi>\n          <br>{% run_summary a.run %}\n          <br><span class="muted">started by</span> <bdi>{% if a.run.started_by %}{{ a.run.started_by.get_username }}{% else %}{{ a.run.started_via }}{% endif %}</bdi>\n        </td>\n        <td>{{ a.requested_at|stamp }} UTC<br><span class="muted">{{ row.requested_ago }} ago</span></td>\n        <td class="actions">\n          {% if not can_approve and not can_reject %}\n            <span class="muted">approvers decide these</span>\n          {% elif row.own_run %}\n            <p class="muted four-eyes">You started this run and cannot approve its steps (four-eyes).</p>\n          {% else %}\n          {% with decide_url=row.decide_url %}\n          {% if can_approve %}\n          <form method="post" action="{{ decide_url }}" hx-post="{{ decide_url }}"\n                hx-target="#live-approvals_inbox" hx-swap="outerHTML" class="stacked decide" id="decide-{{ a.id }}" data-action-kind="approve" hx-preserve="true">{{ state }}\n            <input type="hidden" name="expected" value="{{ a.state }}">\n            <label>Comment <span class="muted">(optional)</span> <textarea name="comment" rows="2" maxlength="4000"></textarea></label>\n            <span class="buttons"><button type="submit" name="decision" value="approve" class="primary" data-row-action="approve">Approve{{ row.target }}</button></span>\n          </form>\n          {% endif %}\n          {% if can_reject %}\n          <details class="reject" id="reject-{{ a.id }}" hx-preserve="true">\n            <summary data-row-action="reject">Reject…{{ row.target }}</summary>\n            <form method="post" action="{{ decide_url }}" hx-post="{{ decide_url }}"\n                  hx-target="#live-approvals_inbox" hx-swap="outerHTML" class="stacked reject-form" data-action-kind="reject">{{ state }}\n              <input type="hidden" name="expected" value="{{ a.state }}">\n              <p class="warning" role="note">Rejecting stops this run and <strong>compensates</strong> it:\n                {{ row.undo_said }}.</p>\n              <label>Reason <span class="muted">(required)</span> <textarea name="comment" rows="2" maxlength="4000" required></textarea></label>\n              <label class="confirm"><input type="checkbox" name="confirm" value="compensate" required> I understand the run will be compensated</label>\n              <span class="buttons"><button type="submit" name="decision" value="reject" class="danger">Reject and compensate{{ row.target }}</button></span>\n            </form>\n          </details>\n          {% endif %}\n          {% endwith %}\n          {% endif %}\n        </td>\n      </tr>\n    {% endwith %}'


@pytest.mark.django_db
def test_approval_rows_are_what_the_inbox_template_wrote(people):
    hostile = HOSTILE + "\u202e"
    waiting = dict(status=RunStatus.WAITING, reason="")
    make_approval(run=make_run(business_key=hostile, summary={"order": hostile, "amount": "12.00 EUR"}, **waiting),
                  step=hostile, reason=hostile * 300)
    make_approval(run=make_run(business_key="", started_via="api", **waiting), deadline_in=timedelta(minutes=-5))
    make_approval(run=make_run(started_by=people["approver"], business_key="ORD-1", **waiting),
                  deadline_in=timedelta(hours=-1), state=ApprovalState.ESCALATED)
    make_approval(run=make_run(started_by=people["operator"], **waiting), reason="")
    root = reverse("console:overview")
    for user in (people["approver"], people["operator"]):  # a rejection's undo text, four-eyes or not
        rows = _approvals_context(user)["rows"]
        assert len(rows) == 4
        for row, can_approve, can_reject in itertools.product(rows, (True, False), (True, False)):
            values = {"row": row, "can_approve": can_approve, "can_reject": can_reject, "root": root}
            values["state"] = Template("{{ s|safe }}").render(Context({"s": "<input type=hidden name=after value=1_2>"}))
            theirs = Template(APPROVAL_ROW_TEMPLATE).render(Context(values))
            ours = Template("{% load queue_rows %}{% approval_row row can_approve=can_approve "
                            "can_reject=can_reject state=state root=root %}").render(Context(values))
            assert ours == theirs, (row["a"].step, can_approve, can_reject)
            assert "<script>" not in ours
    assert any(row["own_run"] for row in _approvals_context(people["approver"])["rows"])
