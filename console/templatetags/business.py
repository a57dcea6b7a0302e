"""Business context on the pages where people decide: a run's summary (``sagas.summaries``)
and a one-line preview of an effect's request, both redacted (core/redaction.py) and short.

* ``{% run_summary run %}``: the run's summary as ``key value`` pairs, each in ``<bdi>``, bidi
  controls made visible, at most ``SHOWN_FIELDS`` pairs of ``SHOWN_CHARS`` characters; an
  error marker (the summary function failed at start) reads "summary unavailable".
* ``{{ effect.request_payload|request_inline }}``: compact JSON of the request, redacted, cut
  at ``INLINE_CHARS`` (the whole payload is behind the payload link next to it).

Only the first part of a value is redacted and shown, so a huge summary or payload costs what
a small one does.
"""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from console.templatetags.payloads import show_controls
from core import redaction
from sagas.integration import ERROR_KEY

register = template.Library()

SHOWN_FIELDS = 8
SHOWN_CHARS = 80
INLINE_CHARS = 160
INLINE_NODES = 60


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _head(value: Any, budget: int) -> Any:
    """The first ``budget`` nodes of ``value`` (depth first, dict keys in order)."""
    left = budget

    def walk(node: Any) -> Any:
        nonlocal left
        left -= 1
        if isinstance(node, dict):
            out = {}
            for key, item in node.items():
                if left <= 0:
                    out["…"] = "…"
                    break
                out[key] = walk(item)
            return out
        if isinstance(node, (list, tuple)):
            items = []
            for item in node:
                if left <= 0:
                    items.append("…")
                    break
                items.append(walk(item))
            return items
        return node

    return walk(value)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return _cut(show_controls(value), SHOWN_CHARS)
    return _cut(json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": ")), SHOWN_CHARS)


@register.simple_tag
def run_summary(run: Any) -> SafeString:
    """Built in Python, not by an included template: every row of the run list and the queues
    shows one, and a template render per row cost more than the rest of the cell."""
    summary = getattr(run, "summary", None)
    if not isinstance(summary, dict) or not summary:
        return mark_safe("")
    error = summary.get(ERROR_KEY)
    fields = [(k, v) for k, v in summary.items() if k != ERROR_KEY]
    head = redaction.redact(dict(_head(dict(fields[:SHOWN_FIELDS]), SHOWN_FIELDS * 20)))
    items = [(_cut(show_controls(key), SHOWN_CHARS), _shown(value)) for key, value in head.items()]
    error_text = _cut(redaction.redact_text(str(error)), 300) if error is not None else ""
    if not items and not error_text:
        return mark_safe("")
    more = max(0, len(fields) - SHOWN_FIELDS)
    parts = [format_html('<span class="kv"><bdi class="k">{}</bdi> <bdi class="v">{}</bdi></span>', key, value)
             for key, value in items]
    if more:
        parts.append(format_html(' <span class="muted">+{} more</span>', more))
    if error_text:
        parts.append(format_html('<span class="muted summary-error" title="{}">summary unavailable</span>',
                                 error_text))
    return format_html('<span class="run-summary">{}</span>', mark_safe("".join(parts)))


@register.filter
def request_inline(value: Any) -> str:
    """A one-line, redacted preview of a JSON value. A plain string: the template escapes it."""
    if value is None:
        return ""
    text = json.dumps(redaction.redact(_head(value, INLINE_NODES)), ensure_ascii=False, default=str,
                      separators=(", ", ": "))
    return _cut(text, INLINE_CHARS)
