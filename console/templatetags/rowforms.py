"""What every row form of a queue page repeats, rendered once per page and written into each
row: ``{% form_state after=cursor filters=filter_query as state %}`` (the CSRF token's hidden
input, as ``{% csrf_token %}`` writes it, and the page's cursor and filters, which an action
carries so that its answer is the same page) and ``{% select_options choices as options %}``
(the ``<option>`` elements of a fixed choice list). On the effects queue's 50 rows these were
a fifth of the template's variables. Both escape every value (``format_html``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.simple_tag(takes_context=True)
def form_state(context: template.Context, *, after: Any = None, filters: Any = None) -> SafeString:
    """The hidden inputs: ``csrfmiddlewaretoken`` when the page has a request's token (a live
    push renders without one, and its forms get the token the page already has), then
    ``after`` and ``filters`` when given (also when empty: the form says "the first page")."""
    parts = []
    token = context.get("csrf_token")
    if token and token != "NOTPROVIDED":
        parts.append(format_html('<input type="hidden" name="csrfmiddlewaretoken" value="{}">', token))
    if after is not None:
        parts.append(format_html('<input type="hidden" name="after" value="{}">', after))
    if filters is not None:
        parts.append(format_html('<input type="hidden" name="filters" value="{}">', filters))
    return mark_safe("\n".join(parts))


@register.simple_tag
def select_options(choices: Iterable[tuple[Any, Any]]) -> SafeString:
    """``<option value="v">label</option>`` for each ``(v, label)``, none selected."""
    return format_html_join("", '<option value="{}">{}</option>', ((value, label) for value, label in choices))
