"""Bounded rendering of what tools, models and users wrote: payloads and long text, and bidi
isolation of short user-controlled strings.

* ``{% payload value url %}``: a JSON value as redacted, indented text (``console_tags.
  pretty_payload``, so the one redaction policy applies). At most ``PREVIEW_CHARS`` characters
  go into the page; a longer value gets a marker saying how much is shown, and either an
  "expand" link that loads the rest from ``url`` (the payload endpoint, console/views/payloads.py)
  with htmx (a real ``href`` too), or, above ``EXPAND_MAX_CHARS``, a download link.
* ``{% long_text value url %}``: the same for free text (an approval's reason, an effect's error
  message, an audit reason).
* ``{{ key|show_controls }}``: bidi control characters made visible (``⟨U+202E⟩``), so a business
  key cannot display as something it is not. Autoescaping still applies (the result is a plain
  string); the templates wrap such strings in ``<bdi>`` so they cannot reorder their
  surroundings.

Guarantee: whatever the size of the value, one use of these tags adds at most
``PREVIEW_CHARS`` characters of it to the page (times the HTML escaping factor), and only that
part is redacted and indented; the value is still read whole from the database and measured
with the C JSON encoder.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import template
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from console.templatetags.console_tags import pretty_payload, redact_text

register = template.Library()

PREVIEW_CHARS = 600
EXPAND_MAX_CHARS = 256 * 1024  # above this the rest is a download, never swapped into the page
SECRET_MARGIN = 400  # characters of text redacted past the preview (longer than any masked secret)

# Embeddings, overrides, isolates and marks that reorder text when displayed.
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def payload_text(value: Any) -> str:
    """The whole redacted text of a JSON value, as the payload endpoint serves it."""
    return "" if value is None else pretty_payload(value)


def plain_text(value: Any) -> str:
    """The whole redacted text of a free-text value."""
    return "" if value is None else redact_text(str(value))


def size_of(value: Any, *, text: bool) -> int:
    """How large ``value`` is, in characters of compact JSON (or of the text): cheap (the C
    encoder), and what both the page and the endpoint compare with ``EXPAND_MAX_CHARS``."""
    if value is None:
        return 0
    if text:
        return len(str(value))
    return len(json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":")))


def pruned(value: Any, budget: int) -> tuple[Any, bool]:
    """A copy of ``value`` cut after ``budget`` nodes, in the order ``pretty_payload`` writes
    them (dict keys sorted), and whether anything was cut. Every node writes at least one
    character, so the copy's text starts with the same ``budget`` characters as the whole
    value's: redacting the copy (each dict value, list item and string on its own) shows what
    redacting the whole would, without redacting megabytes to show 600 characters."""
    left = budget
    cut = False

    def walk(node: Any) -> Any:
        nonlocal left, cut
        left -= 1
        if isinstance(node, dict):
            out = {}
            for key in sorted(node, key=str):
                if left <= 0:
                    cut = True
                    break
                out[key] = walk(node[key])
            return out
        if isinstance(node, (list, tuple)):
            items = []
            for item in node:
                if left <= 0:
                    cut = True
                    break
                items.append(walk(item))
            return items
        return node

    return walk(value), cut


def preview_context(preview: str, cut: bool, size: int, url: str, *, kind: str) -> dict[str, Any]:
    """The context of console/payload.html: ``preview`` (redacted, at most ``PREVIEW_CHARS``),
    whether the value goes on past it, and its ``size`` (``size_of``)."""
    return {
        "kind": kind,
        "preview": preview[:PREVIEW_CHARS],
        "cut": cut,
        "shown": PREVIEW_CHARS,
        "size": size,
        "expandable": size <= EXPAND_MAX_CHARS,
        "url": url,
    }


def payload_context(value: Any, url: str) -> dict[str, Any]:
    """``preview_context`` of a JSON value: its first nodes, redacted and indented."""
    if value is None:
        return preview_context("", False, 0, url, kind="json")
    head, was_cut = pruned(value, PREVIEW_CHARS)
    text = pretty_payload(head)
    return preview_context(text, was_cut or len(text) > PREVIEW_CHARS, size_of(value, text=False), url, kind="json")


def long_text_context(value: Any, url: str) -> dict[str, Any]:
    """``preview_context`` of free text: its start, redacted."""
    whole = "" if value is None else str(value)
    # A secret that starts before the cut is masked whole: redact a margin past it, then cut.
    preview = redact_text(whole[: PREVIEW_CHARS + SECRET_MARGIN])
    return preview_context(preview, len(preview) > PREVIEW_CHARS or len(whole) > PREVIEW_CHARS + SECRET_MARGIN,
                           len(whole), url, kind="text")


def cut_marker(block: dict[str, Any]) -> SafeString:
    """The "Showing the first N characters of SIZE" line of a cut preview, with its "show all
    of it" link (htmx and a real ``href``) or, above ``EXPAND_MAX_CHARS``, a download link."""
    if not block["cut"]:
        return mark_safe("")
    if block["expandable"]:
        link = format_html('<a href="{0}" hx-get="{0}" hx-target="closest .payload-block" hx-swap="outerHTML">'
                           "show all of it</a>", block["url"])
    else:
        link = format_html('<a href="{}?download=1" download>download all of it</a> '
                           '<span class="muted">(too large to show here)</span>', block["url"])
    return format_html('<span class="payload-cut">Showing the first {} characters of {}. {}</span>',
                       block["shown"], filesizeformat(block["size"]), link)


def preview_html(block: dict[str, Any]) -> SafeString:
    """A ``preview_context`` as markup: the preview (escaped) in a ``.payload-block``, then the
    cut marker. Built in Python rather than by an included template: a queue row shows two or
    three of these, and a template's render per use was a third of the effects queue's time."""
    if not block["preview"]:
        return mark_safe("")
    more = " …" if block["cut"] else ""
    if block["kind"] == "json":
        return format_html('<div class="payload-block"><pre class="payload">{}{}</pre>\n{}</div>',
                           block["preview"], more, cut_marker(block))
    return format_html('<span class="payload-block"><bdi class="long-text">{}{}</bdi>\n{}</span>',
                       block["preview"], more, cut_marker(block))


@register.simple_tag
def payload(value: Any, url: str) -> SafeString:
    return preview_html(payload_context(value, url))


@register.simple_tag
def long_text(value: Any, url: str) -> SafeString:
    return preview_html(long_text_context(value, url))


@register.filter
def show_controls(value: Any) -> str:
    """``value`` with each bidi control character shown as ``⟨U+XXXX⟩``."""
    return BIDI_CONTROLS.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", "" if value is None else str(value))
