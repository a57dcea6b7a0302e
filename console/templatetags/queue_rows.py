"""The rows of the ambiguous-effects queue and the approvals inbox, built in Python with
``format_html`` (every value escaped; the markup the loop bodies they replace wrote, byte for
byte: ``tests/console/test_row_rendering.py`` renders both). A queue page shows 50 of these and
each had about 60 template nodes: a third of the page's time at a million runs."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from console.templatetags.ages import iso_time, stamp
from console.templatetags.business import run_summary
from console.templatetags.payloads import long_text, payload, show_controls

register = template.Library()

_STUCK = ' <span class="badge stuck" title="no worker holds its run">stuck</span>'
_COMPENSATION = ' <span class="badge">compensation</span>'
_LOOKUP = {  # (can_lookup, connector_known)
    True: '<span class="yes">yes</span>',
    False: '<span class="muted">no lookup</span>',
    None: '<span class="error">connector not registered here</span>',
}
_QUERY = (
    '\n          <form method="post" action="{url}" hx-post="{url}"\n'
    '                hx-target="#live-effects_queue" hx-swap="outerHTML" data-action-kind="query">{state}\n'
    '            <button type="submit" data-row-action="query">Query provider{target}</button>\n'
    '          </form>\n          '
)
_RESOLVE = (
    '\n          <details class="resolve" id="resolve-{id}" hx-preserve="true"><summary data-row-action="resolve">'
    'Resolve…{target}</summary>\n'
    '            <form method="post" action="{url}" hx-post="{url}"\n'
    '                  hx-target="#live-effects_queue" hx-swap="outerHTML" class="stacked" '
    'data-action-kind="resolve">{state}\n'
    '              <input type="hidden" name="expected" value="{status}">\n'
    '              <label>What happened\n'
    '                <select name="outcome" required>\n'
    '                  <option value="">choose…</option>\n'
    '                  {options}\n'
    '                </select></label>\n'
    '              <label>Downstream reference <span class="muted">(required for succeeded)</span>\n'
    '                <input name="downstream_ref" maxlength="300" autocomplete="off"></label>\n'
    '              <label>Evidence <span class="muted">(required: what you checked, where, ticket)</span>\n'
    '                <textarea name="note" rows="3" maxlength="4000" required></textarea></label>\n'
    '              <button type="submit" class="primary">Record resolution{target}</button>\n'
    '            </form>\n'
    '          </details>\n          '
)


def _run_cells(row: Any, root: str) -> tuple[str, str, str]:
    """The business key line, the summary line and the run line of ``row``'s run."""
    e, run = row.effect, row.run
    key = format_html('<bdi class="mono key">{}</bdi><br>', show_controls(run.business_key)) \
        if run is not None and run.business_key else ""
    summary = format_html("<br>{}", run_summary(run)) if run is not None else ""
    link = format_html('<a class="mono" href="{}runs/{}/" title="{}">{}…</a>', root, e.run_id, e.run_id, row.short)
    about = (format_html('<span class="muted"><bdi>{}</bdi> v{}</span> <span class="badge {}">{}</span>',
                         run.workflow_name, run.version, run.status, run.status)
             if run is not None else mark_safe('<span class="muted">run not found</span>'))
    return key, summary, format_html("{}\n          {}", link, about)


@register.simple_tag
def effect_row(row: Any, *, can_resolve: bool, can_query: bool, state: str, options: str, root: str) -> SafeString:
    """One ``<tr>`` of the effects queue (``console/views/queues.py`` builds ``row``: the effect,
    its run, its URLs and labels)."""
    e = row.effect
    key, summary, run_line = _run_cells(row, root)
    pick = format_html('<td class="pick"><input type="checkbox" name="ids" value="{}" form="bulk-form" '
                       'aria-label="{}"></td>', e.id, row.pick) if can_resolve else ""
    checks = format_html('<br><span class="muted">{} lookup{}</span>', e.checks, "" if e.checks == 1 else "s") \
        if e.checks else ""
    error = (format_html("<strong><bdi>{}</bdi></strong>\n          {}\n          ", e.error_class,
                         long_text(e.error_message, row.error_url))
             if e.error_class else mark_safe('<span class="muted">none recorded</span>'))
    lookup = _LOOKUP[True if row.can_lookup else (False if row.connector_known else None)]
    query = format_html(_QUERY, url=row.query_url, state=state, target=row.target) \
        if can_query and row.can_lookup else ""
    resolve = format_html(_RESOLVE, id=e.id, target=row.target, url=row.resolve_url, state=state, status=e.status,
                          options=options) if can_resolve else ""
    nobody = mark_safe('<span class="muted">operators resolve these</span>') \
        if not can_query and not can_resolve else ""
    return format_html(
        '\n      <tr id="effect-{id}" class="effect" data-action-row>\n'
        '        {pick}\n'
        '        <td>\n'
        '          <span class="badge {status}">{status}</span>{stuck}\n'
        '          <br><a href="#effect-{id}">#{id}</a>{compensation}\n'
        '          <br><span class="muted">intent {intent} UTC</span>\n'
        '        </td>\n'
        '        <td class="business">\n'
        '          {key}<span class="muted">tenant</span> <bdi class="tenant">{tenant}</bdi>\n'
        '          {summary}\n'
        '        </td>\n'
        '        <td>\n'
        '          {run_line}\n'
        '          <br>step <strong><bdi>{step}</bdi></strong>\n'
        '        </td>\n'
        '        <td><bdi>{connector}</bdi><br><bdi class="mono key">{idem}</bdi>\n'
        '          <details class="payload"><summary>request<span class="visually-hidden"> of effect #{id}</span>'
        '</summary>{request}</details>\n'
        '        </td>\n'
        '        <td class="num">{attempts}{checks}</td>\n'
        '        <td class="error-cell">{error}\n'
        '        </td>\n'
        '        <td><span title="since {since} UTC">{unknown_for}</span></td>\n'
        '        <td>{lookup}</td>\n'
        '        <td class="actions">\n'
        '          {query}\n'
        '          {resolve}\n'
        '          {nobody}\n'
        '        </td>\n'
        '      </tr>\n    ',
        id=e.id, pick=pick, status=e.status, stuck=mark_safe(_STUCK) if e.status == "IN_PROGRESS" else "",
        compensation=mark_safe(_COMPENSATION) if e.kind == "compensation" else "", intent=stamp(e.intent_at),
        key=key, tenant=e.tenant, summary=summary, run_line=run_line, step=e.step_name, connector=e.connector,
        idem=show_controls(e.idempotency_key), request=payload(e.request_payload, row.request_url),
        attempts=e.attempts, checks=checks, error=error, since=stamp(row.unknown_since), unknown_for=row.unknown_for,
        lookup=mark_safe(lookup), query=query, resolve=resolve, nobody=nobody,
    )


_APPROVE = (
    '\n          <form method="post" action="{url}" hx-post="{url}"\n'
    '                hx-target="#live-approvals_inbox" hx-swap="outerHTML" class="stacked decide" id="decide-{id}" '
    'data-action-kind="approve" hx-preserve="true">{state}\n'
    '            <input type="hidden" name="expected" value="{expected}">\n'
    '            <label>Comment <span class="muted">(optional)</span> '
    '<textarea name="comment" rows="2" maxlength="4000"></textarea></label>\n'
    '            <span class="buttons"><button type="submit" name="decision" value="approve" class="primary" '
    'data-row-action="approve">Approve{target}</button></span>\n'
    '          </form>\n          '
)
_REJECT = (
    '\n          <details class="reject" id="reject-{id}" hx-preserve="true">\n'
    '            <summary data-row-action="reject">Reject…{target}</summary>\n'
    '            <form method="post" action="{url}" hx-post="{url}"\n'
    '                  hx-target="#live-approvals_inbox" hx-swap="outerHTML" class="stacked reject-form" '
    'data-action-kind="reject">{state}\n'
    '              <input type="hidden" name="expected" value="{expected}">\n'
    '              <p class="warning" role="note">Rejecting stops this run and <strong>compensates</strong> it:\n'
    '                {undo}.</p>\n'
    '              <label>Reason <span class="muted">(required)</span> '
    '<textarea name="comment" rows="2" maxlength="4000" required></textarea></label>\n'
    '              <label class="confirm"><input type="checkbox" name="confirm" value="compensate" required> '
    'I understand the run will be compensated</label>\n'
    '              <span class="buttons"><button type="submit" name="decision" value="reject" class="danger">'
    'Reject and compensate{target}</button></span>\n'
    '            </form>\n'
    '          </details>\n          '
)
_NOT_APPROVER = '\n            <span class="muted">approvers decide these</span>\n          '
_FOUR_EYES = ('\n            <p class="muted four-eyes">You started this run and cannot approve its steps '
              '(four-eyes).</p>\n          ')


def _decision_cell(row: dict[str, Any], *, can_approve: bool, can_reject: bool, state: str) -> str:
    a = row["a"]
    if not can_approve and not can_reject:
        return mark_safe(_NOT_APPROVER)
    if row["own_run"]:
        return mark_safe(_FOUR_EYES)
    fields = dict(url=row["decide_url"], id=a.id, state=state, expected=a.state, target=row["target"])
    approve = format_html(_APPROVE, **fields) if can_approve else ""
    reject = format_html(_REJECT, undo=row["undo_said"], **fields) if can_reject else ""
    return format_html("\n          \n          {}\n          {}\n          \n          ", approve, reject)


@register.simple_tag
def approval_row(row: dict[str, Any], *, can_approve: bool, can_reject: bool, state: str, root: str) -> SafeString:
    """One ``<tr>`` of the approvals inbox (``console/views/queues.py`` builds ``row``: the
    approval, its URLs and labels)."""
    a = row["a"]
    run = a.run
    css = " escalated" if row["escalated"] else (" overdue" if row["overdue"] else "")
    pick = format_html('<td class="pick"><input type="checkbox" name="ids" value="{}" form="bulk-form" '
                       'aria-label="{}"></td>', a.id, row["pick"]) if can_approve or can_reject else ""
    key = format_html('<br><span class="muted">key</span> <bdi class="mono key">{}</bdi>',
                      show_controls(run.business_key)) if run.business_key else ""
    started_by = run.started_by.get_username() if run.started_by else run.started_via
    return format_html(
        '\n      <tr id="approval-{id}" data-action-row class="approval{css}">\n'
        '        {pick}\n'
        '        <td class="deadline">\n'
        '          {escalated}\n'
        '          <time class="countdown{overdue}" datetime="{deadline}" data-deadline="{deadline}">'
        '{remaining}</time>\n'
        '          <br><span class="muted">{deadline_stamp} UTC</span>\n'
        '        </td>\n'
        '        <td><strong><bdi>{step}</bdi></strong><p class="reason">{reason}</p></td>\n'
        '        <td>\n'
        '          <a class="mono" href="{root}runs/{run_id}/" title="{run_id}">{short}…</a>\n'
        '          <span class="muted"><bdi>{workflow}</bdi> v{version}</span> '
        '<span class="badge {status}">{status}</span>\n'
        '          {key}\n'
        '          <br><span class="muted">tenant</span> <bdi class="tenant">{tenant}</bdi>\n'
        '          <br>{summary}\n'
        '          <br><span class="muted">started by</span> <bdi>{started_by}</bdi>\n'
        '        </td>\n'
        '        <td>{requested} UTC<br><span class="muted">{requested_ago} ago</span></td>\n'
        '        <td class="actions">\n'
        '          {decision}\n'
        '        </td>\n'
        '      </tr>\n    ',
        id=a.id, css=css, pick=pick,
        escalated=mark_safe('<span class="badge ESCALATED">ESCALATED</span><br>') if row["escalated"] else "",
        overdue=" overdue" if row["overdue"] else "", deadline=iso_time(a.deadline), remaining=row["remaining"],
        deadline_stamp=stamp(a.deadline), step=a.step, reason=long_text(a.reason, row["reason_url"]), root=root,
        run_id=a.run_id, short=row["short"], workflow=run.workflow_name, version=run.version, status=run.status,
        key=key, tenant=run.tenant, summary=run_summary(run), started_by=started_by,
        requested=stamp(a.requested_at), requested_ago=row["requested_ago"],
        decision=_decision_cell(row, can_approve=can_approve, can_reject=can_reject, state=state),
    )
