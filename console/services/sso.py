"""Single sign-on: what a sign-in through the OpenID Connect provider does to the console's users.

``sso_sign_in`` takes the claims of one sign-in (the verified ID token's, with userinfo's on
top) and, in one transaction:

* finds the user by the provider's ``sub`` (``SsoIdentity``), or makes that link on the first
  sign-in: to a new user named by the ``SAGA_OIDC_USERNAME_CLAIM`` claim, or to the local
  account of that name, whose password then stops working (never a superuser's account, which
  stays the local break-glass way in, and never one linked to another subject);
* sets the user's roles (the Django groups ``viewer``, ``operator``, ``approver``) to exactly
  those that ``SAGA_OIDC_ROLE_MAP`` gives the ``SAGA_OIDC_ROLE_CLAIM`` values, and, when
  ``SAGA_OIDC_TENANT_CLAIM`` is set, their tenant limit (``TenantScope``) to the claim's tenants;
* writes the audit entries: the role change, if any (one ``user.roles`` entry by
  ``system: sso``, its reason the claim values; console/user_audit.py), and the sign-in
  (``auth.login``, by the user, from their address).

The server-side checks (``operators.roles``, ``operators.selectors.tenancy``) read only those
groups and that limit, so every one of them applies to these users unchanged.

A refused sign-in (``SignInRefused``) changes nothing, and is audited as denied in its own
transaction. Other groups than the three roles, ``is_staff`` and ``is_superuser`` are never
set from claims.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import IntegrityError, transaction

from console.models import SsoIdentity
from console.user_audit import role_changes
from operators.actors import system_label
from operators.models import AuditEntry, AuditOutcome, TenantScope
from operators.roles import ROLES
from operators.services.limits import clip_text

SSO_ACTOR = system_label("sso")
LOGIN = "auth.login"
SESSION_END = "auth.session_end"
EVERY_TENANT = "*"
TENANT_MAX = 100  # TenantScope's tenant names
_KEEP = object()


class SignInRefused(Exception):
    """The sign-in is refused; the message says why, for the login page and the audit log."""


def check_settings() -> None:
    """Stop the process at start-up if ``SAGA_OIDC_ROLE_MAP`` names a role the console does not
    have (a typo would otherwise silently give nobody that role)."""
    unknown = sorted({role for roles in settings.SAGA_OIDC_ROLE_MAP.values() for role in roles} - set(ROLES))
    if unknown:
        raise ImproperlyConfigured(f"SAGA_OIDC_ROLE_MAP names {', '.join(map(repr, unknown))}, which "
                                   f"{'is not a role' if len(unknown) == 1 else 'are not roles'}: the roles are "
                                   f"{', '.join(ROLES)}")


def provider_name() -> str:
    return settings.SAGA_OIDC_PROVIDER_NAME


def claim_values(claims: dict[str, Any], name: str) -> list[str]:
    """The claim as a list of strings (absent: none); a claim of another shape refuses the sign-in."""
    value = claims.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise SignInRefused(f"The {name!r} claim from {provider_name()} is neither a string nor a list of strings; "
                        f"ask an administrator to check the provider's claims.")


def roles_from_claims(claims: dict[str, Any]) -> list[str]:
    """The console roles the role claim's values map to (``SAGA_OIDC_ROLE_MAP``); a value the
    map does not name gives none."""
    role_map: dict[str, list[str]] = settings.SAGA_OIDC_ROLE_MAP
    found: set[str] = set()
    for value in claim_values(claims, settings.SAGA_OIDC_ROLE_CLAIM):
        found.update(role_map.get(value, ()))
    return sorted(found)


def tenants_from_claims(claims: dict[str, Any]) -> list[str] | None:
    """The tenants the tenant claim gives (None: every tenant). With ``SAGA_OIDC_TENANT_MAP``
    only the values it names count, mapped; without it each value is a tenant. ``*`` is every
    tenant; no value at all is no tenant (a missing claim never widens what a user sees)."""
    tenant_map: dict[str, list[str]] = settings.SAGA_OIDC_TENANT_MAP
    found: set[str] = set()
    for value in claim_values(claims, settings.SAGA_OIDC_TENANT_CLAIM):
        for tenant in tenant_map.get(value, ()) if tenant_map else [value]:
            if tenant == EVERY_TENANT:
                return None
            if not tenant or len(tenant) > TENANT_MAX or "\x00" in tenant:
                raise SignInRefused(f"The tenant {clip_text(tenant)[:120]!r} from {provider_name()} is not a tenant "
                                    f"name (1 to {TENANT_MAX} characters, no NUL); ask an administrator.")
            found.add(tenant)
    return sorted(found)


def _username(claims: dict[str, Any]) -> str:
    name = settings.SAGA_OIDC_USERNAME_CLAIM
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise SignInRefused(f"{provider_name()} sent no {name!r} claim to name you in the console; "
                            f"ask an administrator.")
    try:
        UnicodeUsernameValidator()(value)
        if len(value) > 150:
            raise ValidationError("too long")
    except ValidationError:
        raise SignInRefused(f"The {name!r} claim from {provider_name()} is not a username the console accepts "
                            f"(at most 150 letters, digits and @ . + - _); ask an administrator.") from None
    return value


def _reason(claims: dict[str, Any]) -> str:
    """What the role change was made from: the claim values (only those configured)."""
    parts = [f"{settings.SAGA_OIDC_ROLE_CLAIM}: {', '.join(claim_values(claims, settings.SAGA_OIDC_ROLE_CLAIM))}"]
    if settings.SAGA_OIDC_TENANT_CLAIM and settings.SAGA_OIDC_TENANT_CLAIM != settings.SAGA_OIDC_ROLE_CLAIM:
        tenant_claim = settings.SAGA_OIDC_TENANT_CLAIM
        parts.append(f"{tenant_claim}: {', '.join(claim_values(claims, tenant_claim))}")
    return clip_text(f"claims from {provider_name()} at sign-in: {'; '.join(parts)}")


def _link(subject: str, claims: dict[str, Any]) -> tuple[User, str]:
    """The user for a subject signing in for the first time, and what the audit entry says of it."""
    username = _username(claims)
    claimed_email = claims.get("email")
    email = claimed_email[:254] if isinstance(claimed_email, str) else ""
    user = get_user_model().objects.select_for_update().filter(username=username).first()
    if user is None:
        user = get_user_model()(username=username, email=email)
        user.set_unusable_password()
        user.save()
        note = "; a new console user"
    elif user.is_superuser:
        raise SignInRefused(f"The console account {username!r} is a superuser's, which single sign-on never takes "
                            f"over; sign in with its password at the break-glass page, or ask an administrator.")
    elif SsoIdentity.objects.filter(user=user).exists():
        raise SignInRefused(f"The console account {username!r} belongs to another identity at {provider_name()}; "
                            f"ask an administrator.")
    else:
        user.set_unusable_password()
        user.save(update_fields=["password"])
        note = "; linked to the existing console account, whose password no longer signs in"
    SsoIdentity.objects.create(user=user, subject=subject)
    return user, note


def _set_roles(user: User, roles: list[str]) -> None:
    groups = {name: Group.objects.get_or_create(name=name)[0] for name in ROLES}
    current = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    if current - set(roles):
        user.groups.remove(*(groups[name] for name in sorted(current - set(roles))))
    if set(roles) - current:
        user.groups.add(*(groups[name] for name in sorted(set(roles) - current)))


def _set_tenants(user: User, tenants: list[str] | None) -> None:
    scope = TenantScope.objects.filter(user=user).first()
    if tenants is None:
        if scope is not None:
            scope.delete()
    elif scope is None:
        TenantScope.objects.create(user=user, tenants=tenants)
    elif sorted(set(scope.tenants)) != tenants:
        scope.tenants = tenants
        scope.save()


def _sign_in(claims: dict[str, Any], ip: str | None) -> User:
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject or len(subject) > 255:
        raise SignInRefused(f"{provider_name()} sent no usable subject (sub) claim; ask an administrator.")
    roles = roles_from_claims(claims)
    tenants: Any = tenants_from_claims(claims) if settings.SAGA_OIDC_TENANT_CLAIM else _KEEP
    identity = SsoIdentity.objects.select_for_update().filter(subject=subject).select_related("user").first()
    with role_changes(label=SSO_ACTOR, reason=_reason(claims)):
        if identity is None:
            user, note = _link(subject, claims)
        else:
            user, note = identity.user, ""
        if not user.is_active:
            raise SignInRefused(f"The console account {user.get_username()!r} is deactivated here; "
                                f"ask an administrator.")
        _set_roles(user, roles)
        if tenants is not _KEEP:
            _set_tenants(user, tenants)
    AuditEntry.objects.create(
        actor=user, actor_label=user.get_username(), action=LOGIN, object_type="user", object_id=str(user.pk), ip=ip,
        outcome=AuditOutcome.OK, message=f"signed in through {provider_name()}{note}",
        after={"roles": roles, "tenants": "unchanged" if tenants is _KEEP else tenants},
    )
    return user


def sso_sign_in(*, claims: dict[str, Any], ip: str | None) -> User:
    """Sign in the holder of ``claims`` (verified by the caller): link or make their user, set
    roles and tenant limit from the claims, audit; all in one transaction. ``SignInRefused``:
    nothing changed, and the refusal is audited (denied)."""
    try:
        with transaction.atomic():
            return _sign_in(claims, ip)
    except IntegrityError:
        refusal = SignInRefused("Another sign-in of the same account was being recorded at that moment; "
                                "sign in again.")
        _audit_refused(claims, ip, str(refusal))
        raise refusal from None
    except SignInRefused as exc:
        _audit_refused(claims, ip, str(exc))
        raise


def _audit_refused(claims: dict[str, Any], ip: str | None, message: str) -> None:
    try:
        label = _username(claims)
    except SignInRefused:
        label = "(no usable username)"  # never a claimed text: it could read as "system: ..."
    AuditEntry.objects.create(
        actor=None, actor_label=label, action=LOGIN, object_type="user", object_id=label[:100], ip=ip,
        outcome=AuditOutcome.DENIED, message=clip_text(message),
    )


def sso_session_end(*, user: User, ip: str | None, message: str) -> None:
    """Record that a single sign-on session was ended because the provider no longer accepts
    the user (or could not be asked)."""
    AuditEntry.objects.create(
        actor=user, actor_label=user.get_username(), action=SESSION_END, object_type="user", object_id=str(user.pk),
        ip=ip, outcome=AuditOutcome.DENIED, message=clip_text(message),
    )
