"""Rendering of untrusted payloads: escaped (autoescape), secrets redacted, long ones cut."""

from __future__ import annotations

import json
import re
from typing import Any

from django import template

register = template.Library()

SECRET_KEY_PATTERN = re.compile(r"pass(word)?|token|secret|card|authorization|cookie|api[_-]?key|cvv|pan", re.I)
REDACTED = "•••• redacted"
PREVIEW_CHARS = 600


def redact(value: Any) -> Any:
    """A copy of ``value`` with every value under a secret-looking key replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if SECRET_KEY_PATTERN.search(str(k)) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


@register.filter
def pretty_payload(value: Any) -> str:
    """Redacted, indented JSON text. Returned as a plain string: the template escapes it."""
    if value is None:
        return ""
    return json.dumps(redact(value), indent=2, sort_keys=True, ensure_ascii=False, default=str)


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
