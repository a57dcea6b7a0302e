"""Form fields that say they are wrong to assistive technology."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

register = template.Library()


@register.simple_tag
def invalid_if(errors: Any, field: str, described_by: str) -> str:
    """`` aria-invalid="true" aria-describedby="<described_by>"`` on a field of a hand-written
    filter form when ``errors`` (a form's errors) name ``field``; nothing otherwise."""
    if errors and field in errors:
        return format_html(' aria-invalid="true" aria-describedby="{}"', described_by)
    return ""
