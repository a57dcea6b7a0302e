"""Login lockouts (django-axes, settings ``AXES_*``): audited, and shown as a page that says when
to try again.

A lockout is one username from one address reaching ``AXES_FAILURE_LIMIT`` failed logins. It
writes one ``AuditEntry`` (action ``auth.lockout``, outcome denied, ``actor_label`` the username
that was tried, ``ip`` the address). Attempts refused while it lasts restart the cool-off but
write no further entry, so a script hammering the form cannot flood the append-only audit log;
their count is in axes' access attempts (admin). Ordinary failed logins are not audited.

A break-glass sign-in (a superuser's password while local passwords are off,
``console.oidc.BreakGlassBackend``) writes an ``auth.login`` entry; single sign-on's sign-ins are
audited where they are made (console/services/sso.py).
"""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_cool_off, get_failure_limit
from axes.signals import user_locked_out
from django.contrib.auth.signals import user_logged_in
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from operators.models import AuditEntry, AuditOutcome

ACTION = "auth.lockout"
BREAK_GLASS_BACKEND = "console.oidc.BreakGlassBackend"


def _minutes_left(request: HttpRequest) -> int:
    cool_off = get_cool_off(request)
    return max(1, math.ceil(cool_off.total_seconds() / 60)) if cool_off else 0


def audit_lockout(sender: Any, request: HttpRequest, username: str | None, ip_address: str | None,
                  **kwargs: Any) -> None:
    failures = getattr(request, "axes_failures_since_start", None)
    limit = get_failure_limit(request, getattr(request, "axes_credentials", None))
    if failures is not None and failures > limit:
        return  # an attempt during the lockout: the lockout itself is already in the log
    label = (username or "").replace("\x00", "")
    AuditEntry.objects.create(
        actor=None, actor_label=label[:200], action=ACTION, object_type="user", object_id=label[:100],
        ip=ip_address or None, outcome=AuditOutcome.DENIED,
        message=f"{failures or limit} failed logins from this address: logins locked for "
                f"{_minutes_left(request)} minutes",
    )


def lockout_response(request: HttpRequest, original_response: HttpResponse | None,
                     credentials: dict | None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the login page's answer while the username is locked out here."""
    return render(request, "console/locked_out.html", {"minutes": _minutes_left(request)}, status=429)


def audit_break_glass(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if getattr(user, "backend", "") != BREAK_GLASS_BACKEND:
        return
    AuditEntry.objects.create(
        actor=user, actor_label=user.get_username(), action="auth.login", object_type="user", object_id=str(user.pk),
        ip=request.META.get("REMOTE_ADDR") if request is not None else None, outcome=AuditOutcome.OK,
        message="break-glass sign-in with a password (local passwords are off)",
    )


def connect_signals() -> None:
    user_locked_out.connect(audit_lockout, dispatch_uid="console.auth_audit.audit_lockout")
    user_logged_in.connect(audit_break_glass, dispatch_uid="console.auth_audit.audit_break_glass")
