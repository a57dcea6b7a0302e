"""OpenID Connect sign-in for the console, through mozilla-django-oidc (settings ``SAGA_OIDC_*``
and its own ``OIDC_*``, config/settings.py; docs/operations/single-sign-on.md).

* ``SsoBackend``: the authorization-code flow's backend. It merges the verified ID token's
  claims with userinfo's (some providers put groups in one only), refuses userinfo about
  another subject, and hands the claims to ``console.services.sso.sso_sign_in``, which links
  the user, sets roles and tenant limit and audits, in one transaction.
* ``SsoSessionCheck``: middleware. Every ``SAGA_OIDC_RECHECK_SECONDS`` (at the first request
  after that), a single sign-on session asks the provider's userinfo endpoint, with the
  session's access token (refreshed with its refresh token if the provider says it expired),
  whether the provider still accepts the user. A refusal, or a provider that cannot be asked,
  ends the console session at that request, whatever its method (htmx and form posts included),
  audits it (``auth.session_end``) and tells the user's open live pages to check their session
  (which is gone). Password sessions are not checked: the provider knows nothing of them.
* ``BreakGlassBackend``: with ``SAGA_LOCAL_PASSWORDS`` off, passwords sign in superusers only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import SuspiciousOperation
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from console.broadcast import broadcast
from console.services.sso import SignInRefused, provider_name, sso_session_end, sso_sign_in
from console.topics import user_topic

log = logging.getLogger("console.sso")

SSO_BACKEND = "console.oidc.SsoBackend"
BREAK_GLASS_BACKEND = "console.oidc.BreakGlassBackend"
TOKENS = "sso_tokens"  # in the session: {"access": ..., "refresh": ..., "sub": ...}
CHECKED_AT = "sso_checked_at"  # in the session: when the provider last accepted the user (epoch seconds)


def client_ip(request: HttpRequest) -> str | None:
    return request.META.get("REMOTE_ADDR")


class SsoBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, with the console's users, roles and audit
    (``sso_sign_in``). What a refused sign-in says is left on the request (``sso_refusal``)
    and the tokens to keep (``sso_tokens``), for the callback view."""

    request: HttpRequest

    def get_token(self, payload: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = super().get_token(payload)
        self.request.sso_tokens = {  # type: ignore[attr-defined]
            "access": info.get("access_token") or "", "refresh": info.get("refresh_token") or "",
        }
        return info

    def store_tokens(self, access_token: str, id_token: str) -> None:
        """Nothing here: the callback view stores them once the user is logged in (a login that
        replaces another user's session empties it)."""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return isinstance(claims.get("sub"), str) and bool(claims["sub"])

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        info = super().get_userinfo(access_token, id_token, payload)
        if not isinstance(info, dict) or info.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the provider's userinfo is about another subject than its ID token")
        return {**payload, **info}

    def get_user(self, user_id: Any) -> Any:
        """The session's user while active, as with passwords (mozilla-django-oidc's own returns
        a user deactivated in the console too, whose session would then go on)."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise SuspiciousOperation("the provider sent no subject (sub) claim")
        try:
            user = sso_sign_in(claims=claims, ip=client_ip(self.request))
        except SignInRefused as exc:
            self.request.sso_refusal = str(exc)  # type: ignore[attr-defined]
            return None
        self.request.sso_tokens["sub"] = claims["sub"]  # type: ignore[attr-defined]
        return user


def axes_exempt(request: HttpRequest | None, credentials: dict[str, Any] | None) -> bool:
    """``AXES_WHITELIST_CALLABLE``: django-axes counts password attempts only. A single sign-on
    callback (which authenticates with a PKCE verifier, and no username) would otherwise count
    as a failed login of "no username" from its address, and a few refused sign-ins from one
    office's address would lock every colleague there out of single sign-on. The provider
    throttles its own password form."""
    return credentials is not None and "code_verifier" in credentials


class BreakGlassBackend(ModelBackend):
    """Passwords with ``SAGA_LOCAL_PASSWORDS`` off: a superuser's still signs in (the way in when
    the provider is down); anyone else's does not, at any form (the console's, the admin's).
    A session it made lasts only while its user is an active superuser."""

    def user_can_authenticate(self, user: Any) -> bool:
        return super().user_can_authenticate(user) and bool(getattr(user, "is_superuser", False))


# --- the provider still accepts the user ------------------------------------------------------------


def _userinfo(access_token: str) -> requests.Response:
    return requests.get(settings.OIDC_OP_USER_ENDPOINT, headers={"Authorization": f"Bearer {access_token}"},
                        timeout=settings.OIDC_TIMEOUT)


def _refresh(refresh_token: str) -> dict[str, Any] | None:
    """New tokens for a refresh token (None: the provider refused it)."""
    answer = requests.post(settings.OIDC_OP_TOKEN_ENDPOINT, timeout=settings.OIDC_TIMEOUT, data={
        "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": settings.OIDC_RP_CLIENT_ID,
        "client_secret": settings.OIDC_RP_CLIENT_SECRET,
    })
    if answer.status_code >= 500:
        answer.raise_for_status()
    if answer.status_code != 200:
        return None
    data: dict[str, Any] = answer.json()
    return data if data.get("access_token") else None


def confirm(tokens: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    """Ask the provider whether it still accepts the holder of ``tokens``: (None, the tokens to
    keep, refreshed or not) if so, else (why not, ``tokens``)."""
    name = provider_name()
    refused = f"{name} no longer accepts your sign-in (deactivated, or signed out there)"
    try:
        answer = _userinfo(tokens.get("access", ""))
        if answer.status_code in (401, 403) and tokens.get("refresh"):
            fresh = _refresh(tokens["refresh"])
            if fresh is None:
                return refused, tokens
            tokens = {**tokens, "access": fresh["access_token"], "refresh": fresh.get("refresh_token") or
                      tokens["refresh"]}
            answer = _userinfo(tokens["access"])
        if answer.status_code in (401, 403):
            return refused, tokens
        answer.raise_for_status()
        subject = answer.json().get("sub")
    except (requests.RequestException, ValueError) as exc:
        log.warning("single sign-on: %s could not be asked whether a session is still valid: %s", name, exc)
        return f"{name} could not be asked whether your sign-in is still valid", tokens
    if subject != tokens.get("sub"):
        return f"{name} answered about another account", tokens
    return None, tokens


class SsoSessionCheck:
    """See the module's docstring. Exempt: the sign-in pages themselves and the HTTP API (keys,
    not sessions)."""

    EXEMPT = ("/login/", "/logout/", "/oidc/", "/api/", "/static/")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (settings.SAGA_OIDC_ENABLED and not request.path.startswith(self.EXEMPT)
                and request.session.get(BACKEND_SESSION_KEY) == SSO_BACKEND):
            refusal = self._check(request)
            if refusal is not None:
                return self._signed_out(request, refusal)
        return self.get_response(request)

    @staticmethod
    def _due(session: Any) -> bool:
        return time.time() >= float(session.get(CHECKED_AT, 0)) + settings.SAGA_OIDC_RECHECK_SECONDS

    def _check(self, request: HttpRequest) -> str | None:
        """None: the session goes on; else why it was ended (and it is, audited)."""
        session = request.session
        if not self._due(session):
            return None
        # One check per session at a time: the requests of one page (htmx, a live reconnect) that
        # find it due wait here, then see the first one's outcome in the stored session: a refresh
        # token is never spent twice (providers that rotate them refuse the second use), and an
        # ended session is ended and audited once.
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"sso:{session.session_key}"])
            stored = session.__class__(session.session_key)
            if stored.get(BACKEND_SESSION_KEY) != SSO_BACKEND:
                auth.logout(request)  # ended meanwhile, by another request of it
                return "your session ended"
            for key in (TOKENS, CHECKED_AT):
                if key in stored:
                    session[key] = stored[key]
            if not self._due(session):
                return None
            refusal, tokens = confirm(session.get(TOKENS) or {})
            if refusal is None:
                session[TOKENS] = tokens
                session[CHECKED_AT] = time.time()
                session.save()  # now, under the lock: the next request waiting on it reads this
                return None
            user = request.user
            if user.is_authenticated:
                sso_session_end(user=user, ip=client_ip(request), message=f"session ended: {refusal}")
                broadcast(user_topic(user.pk))  # after commit: its open live pages find the session gone
            auth.logout(request)
            return refusal

    @staticmethod
    def _signed_out(request: HttpRequest, refusal: str) -> HttpResponse:
        messages.error(request, f"You were signed out: {refusal}. Sign in again to go on.")
        login = reverse("console:login")
        if request.headers.get("HX-Request") == "true":  # django-htmx's middleware runs after this one
            return HttpResponseClientRedirect(login)
        if request.method == "GET":
            return redirect_to_login(request.get_full_path(), login)
        return HttpResponseRedirect(login)
