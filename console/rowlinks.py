"""What a queue's rows need that the template would otherwise compute per row, done once per
row in Python: the URLs of its actions and payloads (one ``reverse`` per page, not six per row)
and the hidden text that names what a row's action acts on (``action_target``: the markup of
``console/action_target.html``, built with ``format_html``, which escapes every value). On a
page of 50 rows these were a third of the template's time."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from console.templatetags.payloads import show_controls

_RUN = uuid.UUID(int=0)
_ID = 987654321987


def url_maker(name: str, *, run: bool = False, item: bool = True, kind: str | None = None) -> Callable[..., str]:
    """A function ``(run_id=..., item_id=...) -> URL`` of the route ``name``, reversed once with
    placeholder arguments (a run id, a kind, an integer id, in the route's order)."""
    args: list[Any] = []
    if run:
        args.append(_RUN)
    if kind is not None:
        args.append(kind)
    if item:
        args.append(_ID)
    pattern = reverse(name, args=args)

    def make(*, run_id: Any = None, item_id: Any = None) -> str:
        url = pattern
        if run:
            url = url.replace(str(_RUN), str(run_id), 1)
        if item:
            url = url.replace(str(_ID), str(int(item_id)), 1)
        return url

    return make


def action_target(*, run_id: Any, key: str = "", step: str = "", effect_id: Any = None) -> SafeString:
    """The hidden text after an action's visible label ("Approve" + " charge_card on run
    1a2b3c4d (order-1042)"), as ``console/action_target.html`` renders it."""
    parts = [format_html("effect #{}, ", effect_id) if effect_id else "",
             format_html("<bdi>{}</bdi> on ", step) if step else "",
             format_html("run {}", str(run_id)[:8]),
             format_html(" (<bdi>{}</bdi>)", Truncator(show_controls(key)).chars(60)) if key else ""]
    return format_html('<span class="visually-hidden"> {}</span>', mark_safe("".join(parts)))


def pick_label(kind: str, item_id: Any, *, step: str, run_id: Any, key: str = "") -> str:
    """The accessible name of a row's bulk checkbox: "select effect #12: capture on run 1a2b3c4d
    (order-1042)". A plain string: the template escapes it."""
    said = f"select {kind} {item_id}: {step} on run {str(run_id)[:8]}"
    return f"{said} ({Truncator(show_controls(key)).chars(60)})" if key else said

