"""The history timeline's small formats: a time to the millisecond (Django's ``date`` filter has
no milliseconds), a duration as people read it, and a journal entry's payload folded to one line
that opens to the redacted preview (console/templatetags/payloads.py renders it: the same cap,
redaction and "show all" link)."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django import template
from django.urls import get_script_prefix, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from console.templatetags.ages import iso_time
from console.templatetags.payloads import cut_marker, payload_context
from operators.selectors.runs import REPAIR_KINDS, repair_sentence

register = template.Library()

SUMMARY_CHARS = 90


def _duration(value: timedelta) -> str:
    micros = abs(value) // timedelta(microseconds=1)
    sign = "−" if value < timedelta(0) else ""
    if micros < 1000:
        return f"{sign}{micros / 1000:.1f} ms"
    if micros < 1_000_000:
        return f"{sign}{micros // 1000} ms"
    seconds = micros / 1_000_000
    if seconds < 60:
        return f"{sign}{seconds:.1f} s" if seconds < 10 else f"{sign}{seconds:.0f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{sign}{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{sign}{whole // 3600} h {whole % 3600 // 60} min"
    return f"{sign}{whole // 86400} d {whole % 86400 // 3600} h"


@register.filter
def duration(value: Any) -> str:
    """``timedelta(seconds=0.0503)`` -> ``50 ms``; ``1.25 s``, ``3 min 4 s``, ``2 h 5 min``,
    ``3 d 4 h``; negative (clocks of two hosts) with a minus sign; anything else: empty."""
    return _duration(value) if isinstance(value, timedelta) else ""


@register.filter
def clock(value: Any) -> str:
    """``23:59:58.345 UTC``: the time of day to the millisecond, in the current time zone, named.
    (``strftime``, not the ``date`` filter: a page formats hundreds of these.)"""
    if not isinstance(value, datetime):
        return ""
    local = timezone.localtime(value)
    return f"{local:%H:%M:%S}.{local.microsecond // 1000:03d} {local.tzname()}"


@register.filter
def full_time(value: Any) -> str:
    """``Wednesday 4 March 2026, 23:59:58.345 UTC`` (for a title: the date the row leaves out)."""
    if not isinstance(value, datetime):
        return ""
    local = timezone.localtime(value)
    return f"{local:%A} {local.day} {local:%B %Y}, {clock(value)}"


@lru_cache(maxsize=256)
def _urls(script_prefix: str, run_id: str) -> tuple[str, str]:
    """The run's history page and its entries' payload URL without the seq: reversed once per
    run, not twice per row."""
    one = reverse("console:run_item_payload", args=[run_id, "entry", 1])
    assert one.endswith("/1/"), one
    return reverse("console:run_history", args=[run_id]), one[: -len("1/")]


@register.filter
def history_url(run_id: Any) -> str:
    return _urls(get_script_prefix(), str(run_id))[0]


def entry_url(run_id: Any, seq: int) -> str:
    """The payload endpoint of entry ``seq`` (console/views/payloads.py)."""
    return f"{_urls(get_script_prefix(), str(run_id))[1]}{int(seq)}/"


@register.filter
def gap(value: Any) -> str:
    """The time since the entry before: ``+50 ms``, ``+1.2 s``; ``−3 ms`` when that entry was
    written by a host whose clock is ahead; empty for the first entry."""
    if not isinstance(value, timedelta):
        return ""
    return _duration(value) if value < timedelta(0) else "+" + _duration(value)


@register.filter
def repair_said(entry: Any) -> str:
    """A repair's entry (moved, redriven, forked, an operator's pause or re-run) as a sentence;
    empty for any other entry (``operators.selectors.runs.repair_sentence``)."""
    if entry.kind not in REPAIR_KINDS:
        return ""
    return repair_sentence(entry.kind, entry.name, entry.payload)


@register.simple_tag
def entry_payload(entry: Any) -> SafeString:
    """An entry's payload folded into ``<details>``: the summary is the start of the redacted
    preview on one line; opened, the preview itself (the markup of ``payloads.preview_html``,
    with its "show all of it" link when cut). Built in Python: a page shows 100 of these."""
    block = payload_context(entry.payload, entry_url(entry.run_id, entry.seq))
    if not block["preview"]:
        return mark_safe('<span class="entry-payload muted">—</span>')
    line = " ".join(block["preview"].split())
    summary = line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1] + "…"
    return format_html('<details class="entry-payload"><summary><span class="mono">{}</span></summary>'
                       '<div class="payload-block"><pre class="payload">{}{}</pre>\n{}</div></details>',
                       summary, block["preview"], " …" if block["cut"] else "", cut_marker(block))


def _day_html(entry: Any) -> str:
    if not entry.new_day:
        return ""
    local = timezone.localtime(entry.created_at)
    return format_html('<li class="day"><time datetime="{}">{}</time></li>\n',
                       dateformat.format(local, "Y-m-d"), dateformat.format(local, "l j F Y"))


def _pair_html(entry: Any) -> str:
    pair = entry.pair
    if pair is None:
        return ""
    intent = pair.role == "intent"
    link = ""
    if pair.seq:
        href = f"#seq-{pair.seq}" if pair.on_page else f"{history_url(entry.run_id)}?seq={pair.seq}"
        link = format_html(' <a href="{}" title="{}">#{}</a>', href, "its outcome" if intent else "its intent",
                           pair.seq)
    waited = "no outcome yet" if intent else ""
    after = waited if pair.elapsed is None else "after " + duration(pair.elapsed)
    return format_html('{}{} <span class="badge {}">{}</span> <span class="muted">{}</span>',
                       "→" if intent else "↳ of", link, pair.badge, pair.status, after)


@register.simple_tag
def history_entry(entry: Any) -> SafeString:
    """One timeline row (``console.selectors.history.TimelineRow``) as a ``<li>``, with the day
    heading before it when the day changes: built with ``format_html`` (every value escaped),
    as the markup an included template wrote, one row of the 100 a page shows at a time."""
    gap_title = format_html(' title="since entry #{}"', entry.seq - 1) if entry.gap is not None else ""
    said = repair_said(entry)
    return format_html(
        '{}<li class="entry kind-{}" id="seq-{}"{}>\n'
        '  <a class="seq mono" href="#seq-{}">#{}</a>\n'
        '  <time datetime="{}" title="{}">{}</time>\n'
        '  <span class="entry-gap"{}>{}</span>\n'
        '  <span class="entry-kind">{}</span>\n'
        '  <bdi class="entry-name">{}</bdi>\n'
        '  <bdi class="entry-worker mono" title="{}">{}</bdi>\n'
        '  <span class="entry-pair">{}</span>\n'
        '  {}\n'
        '  {}\n'
        '</li>\n',
        _day_html(entry), entry.kind, entry.seq,
        format_html(' data-pair="{}"', entry.pair.role) if entry.pair is not None else "",
        entry.seq, entry.seq,
        iso_time(entry.created_at), full_time(entry.created_at), clock(entry.created_at),
        gap_title, gap(entry.gap),
        entry.kind, entry.name, entry.worker_id, entry.worker_id,
        _pair_html(entry),
        entry_payload(entry),
        format_html('<bdi class="entry-said">{}</bdi>', said) if said else "",
    )
