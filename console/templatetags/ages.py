"""``human_age``: how long something has waited, as people say it ("40 s", "12 min", "3 h", "2 d").

Usage: ``{% load ages %}{{ seconds|human_age }}`` (a number of seconds, a ``timedelta``, or a
``datetime`` in the past, counted from now). None or "" shows "–".
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()

MINUTE, HOUR, DAY = 60, 3600, 86400


def human_age(seconds: float) -> str:
    """Whole units, rounded down: under a minute in seconds, under an hour in minutes, under two
    days in hours, then in days. Negative ages (clock skew) read as 0 s."""
    s = max(0, int(seconds))
    if s < MINUTE:
        return f"{s} s"
    if s < HOUR:
        return f"{s // MINUTE} min"
    if s < 2 * DAY:
        return f"{s // HOUR} h"
    return f"{s // DAY} d"


@register.filter(name="human_age")
def human_age_filter(value: Any) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, datetime):
        value = (timezone.now() - value).total_seconds()
    elif isinstance(value, timedelta):
        value = value.total_seconds()
    try:
        return human_age(float(value))
    except (TypeError, ValueError):
        return "–"


@register.filter
def stamp(value: datetime | None) -> str:
    """``2026-12-05 13:20:07``: a moment in the console's time zone (UTC), as ``|date:"Y-m-d
    H:i:s"`` writes it, with ``strftime`` (Django's date formatter was a tenth of the approvals
    inbox's time: four moments on each of 100 rows). None or "" shows nothing."""
    if not value:
        return ""
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


@register.filter
def iso_time(value: datetime | None) -> str:
    """ISO 8601 with the offset (``|date:'c'``), for ``<time datetime>``."""
    if not value:
        return ""
    return timezone.localtime(value).isoformat()
