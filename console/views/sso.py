"""Signing in: the login page (password form and/or "Sign in with <provider>"), the break-glass
password page for superusers when local passwords are off, and the OpenID Connect start and
callback (mozilla-django-oidc's views; 404 while single sign-on is off).

With ``SAGA_LOCAL_PASSWORDS`` off the login page has no password form and refuses a posted one
(403, nothing checked); the backends refuse every password but a superuser's anyway
(``console.oidc.BreakGlassBackend``), at any form."""

from __future__ import annotations

import time
from typing import Any

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from console.forms import LoginForm
from console.oidc import CHECKED_AT, TOKENS
from console.services.sso import provider_name

TEMPLATE = "console/login.html"


def _sso(request: HttpRequest) -> dict[str, Any]:
    """The login page's single sign-on part (empty while it is off)."""
    if not settings.SAGA_OIDC_ENABLED:
        return {}
    nxt = request.GET.get("next", "")
    if not url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        nxt = ""
    return {"sso_provider": provider_name(), "sso_next": nxt, "passwords": settings.SAGA_LOCAL_PASSWORDS}


def login(request: HttpRequest) -> HttpResponseBase:
    context = _sso(request) or {"passwords": True}
    if settings.SAGA_LOCAL_PASSWORDS:
        view = auth_views.LoginView.as_view(template_name=TEMPLATE, authentication_form=LoginForm,
                                            extra_context=context)
        return view(request)
    if request.method == "POST":
        return render(request, TEMPLATE, {**context, "password_refused": True}, status=403)
    return render(request, TEMPLATE, context)


def break_glass(request: HttpRequest) -> HttpResponseBase:
    """Superusers' password sign-in while local passwords are off (404 while they are on: the
    login page has the form then)."""
    if settings.SAGA_LOCAL_PASSWORDS:
        raise Http404("local passwords are on: use the login page")
    view = auth_views.LoginView.as_view(template_name=TEMPLATE, authentication_form=LoginForm,
                                        extra_context={"passwords": True, "break_glass": True})
    return view(request)


class _Start(OIDCAuthenticationRequestView):
    pass


class _Callback(OIDCAuthenticationCallbackView):
    """mozilla-django-oidc's callback, saying why a sign-in failed on the login page, and keeping
    the tokens the session check (console/oidc.py) uses, once the user is logged in."""

    @property
    def failure_url(self) -> str:
        return reverse("console:login")

    def login_failure(self) -> HttpResponse:
        why = getattr(self.request, "sso_refusal", "") or (
            f"Signing in with {provider_name()} did not complete; try again.")
        messages.error(self.request, why)
        return super().login_failure()

    def login_success(self) -> HttpResponse:
        response = super().login_success()
        self.request.session[TOKENS] = getattr(self.request, "sso_tokens", {})
        self.request.session[CHECKED_AT] = time.time()  # the provider has just accepted them
        return response

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            return super().get(request)
        except requests.RequestException:
            request.sso_refusal = f"{provider_name()} did not answer; try again in a moment."  # type: ignore[attr-defined]
            return self.login_failure()


@require_GET
def sso_start(request: HttpRequest) -> HttpResponseBase:
    if not settings.SAGA_OIDC_ENABLED:
        raise Http404("single sign-on is off")
    return _Start.as_view()(request)


@require_GET
def sso_callback(request: HttpRequest) -> HttpResponseBase:
    if not settings.SAGA_OIDC_ENABLED:
        raise Http404("single sign-on is off")
    return _Callback.as_view()(request)
