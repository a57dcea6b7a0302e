"""``{% bulk_toolbar "effects" %}``: the bulk-action bar of a list page (runs, effects,
approvals). Rows join its form with ``<input type="checkbox" name="ids" form="bulk-form">``."""

from __future__ import annotations

from typing import Any

from django import template

from console.selectors.bulk import actions_for, filter_params
from operators import roles

register = template.Library()


@register.inclusion_tag("console/bulk_toolbar.html", takes_context=True)
def bulk_toolbar(context: template.Context, kind: str) -> dict[str, Any]:
    """The actions the user's roles allow on list ``kind``, and the page's current filters
    (carried to the preview when everything matching them is chosen)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if request is None or user is None:
        return {"bulk_actions": []}
    actions = [a for a in actions_for(kind) if roles.can(user, a.item_action)]
    filters = {key: str(request.GET.get(key, "")) for key in filter_params(kind) if request.GET.get(key)}
    return {"bulk_actions": actions, "bulk_filters": filters, "csrf_token": context.get("csrf_token"), "kind": kind}
