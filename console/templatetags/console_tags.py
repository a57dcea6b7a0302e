"""Rendering of untrusted payloads: escaped (autoescape), secrets redacted, long ones cut."""

from __future__ import annotations

from typing import Any

from django import template

from core import redaction

register = template.Library()

REDACTED = redaction.MARK
PREVIEW_CHARS = 600


@register.filter(name="redact_text")
def redact_text(value: Any) -> str:
    """Free text (an error message, a reason) with embedded secrets masked. A plain string:
    the template escapes it."""
    return "" if value is None else redaction.redact_text(str(value))


@register.filter
def pretty_payload(value: Any) -> str:
    """Redacted, indented JSON text. Returned as a plain string: the template escapes it."""
    return "" if value is None else redaction.redact_json(value)


@register.filter
def payload_preview(value: Any) -> str:
    text = pretty_payload(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + " …"


@register.filter
def payload_is_long(value: Any) -> bool:
    return len(pretty_payload(value)) > PREVIEW_CHARS


@register.filter
def short_hash(value: str) -> str:
    return (value or "")[:12]
