"""The page for the HTTP API's keys and hooks (staff only): the keys with their state, use and
rate, "expire now" and "revoke" (confirmed, with a reason, audited as ``apikey.expire`` /
``apikey.revoke`` by ``api.keys``), and the signed webhooks in (never their secret). Keys are
made with ``manage.py createapikey``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from api.keys import EXPIRE, REVOKE, NotStaff, apikey_end, is_staff
from api.models import ApiKey, Hook
from console.forms import MAX_TEXT_CHARS, Problems, text_field
from console.views.base import ConsoleRequest, actor_of
from operators.services.actions import Refused

# The state's badge, in the colours the console already gives these meanings (console.css).
_BADGE = {"ACTIVE": "COMPLETED", "EXPIRED": "NEEDS_ATTENTION", "REVOKED": "FAILED"}


class KeyEndForm(Problems, forms.Form):
    reason = text_field("Reason", MAX_TEXT_CHARS, required="A reason is required; it goes into the audit log.")
    confirm = forms.BooleanField(error_messages={"required": "Tick the box to confirm; nothing was changed."})


def _page(request: ConsoleRequest, *, status: int = 200, problems: list[str] | None = None) -> HttpResponse:
    keys = list(ApiKey.objects.select_related("user__tenant_scope", "created_by").order_by("name"))
    rows: list[dict[str, Any]] = []
    for key in keys:
        scope = getattr(key.user, "tenant_scope", None)
        rows.append({"key": key, "state": key.state, "badge": _BADGE[key.state],
                     "tenants": None if scope is None else scope.tenants})
    hooks = list(Hook.objects.order_by("name").values("name", "signal", "workflow", "tenant", "enabled",
                                                      "signature_scheme"))
    return render(request, "console/api_keys.html", {"rows": rows, "hooks": hooks, "problems": problems or []},
                  status=status)


@require_GET
@login_required
def api_keys(request: ConsoleRequest) -> HttpResponse:
    if not is_staff(request.user):
        raise PermissionDenied("only staff see API keys")
    return _page(request)


def _end(request: ConsoleRequest, key_id: int, action: str) -> HttpResponse:
    form = KeyEndForm(request.POST)
    reason = str(request.POST.get("reason", "")).strip()
    if is_staff(request.user):
        if not ApiKey.objects.filter(pk=key_id).exists():
            raise Http404("no such API key")
        if not form.is_valid():
            return _page(request, status=400, problems=form.problems())
        reason = form.cleaned_data["reason"]
    try:  # not staff: denied and audited by the service, whatever was sent
        key = apikey_end(actor=actor_of(request), key_id=key_id, action=action, reason=reason)
    except NotStaff as exc:
        raise PermissionDenied(str(exc)) from exc
    except Refused as exc:
        return _page(request, status=409, problems=[str(exc)])
    done = "expired now" if action == EXPIRE else "revoked"
    messages.success(request, f"Key “{key.name}” {done}: it is refused from its next request on.")
    return redirect("console:api_keys")


@require_POST
@login_required
def api_key_expire(request: ConsoleRequest, key_id: int) -> HttpResponse:
    return _end(request, key_id, EXPIRE)


@require_POST
@login_required
def api_key_revoke(request: ConsoleRequest, key_id: int) -> HttpResponse:
    return _end(request, key_id, REVOKE)
