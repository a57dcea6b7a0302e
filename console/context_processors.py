from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import reverse

from core.replica import behind_seconds
from operators import roles

NAV = [
    ("Runs", "console:runs"),
    ("Ambiguous effects", "console:effects"),
    ("Approvals", "console:approvals"),
    ("Schedules", "console:schedules"),
    ("Versions", "console:versions"),
    ("Workers", "console:workers"),
    ("Connectors", "console:connectors"),
    ("Audit log", "console:audit"),
    ("Notifications", "console:notifications"),
]


def console(request: HttpRequest) -> dict[str, Any]:
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    items: list[dict[str, Any]] = []
    for label, name in NAV:
        url = reverse(name)
        items.append({"label": label, "url": url, "current": request.path.startswith(url)})
    # A page read from a standby more than a second behind says so (core/replica.py).
    return {"console_nav": items, "console_roles": sorted(roles.roles_of(request.user)),
            "standby_behind": behind_seconds()}
