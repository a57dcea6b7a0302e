"""API keys: create, check, revoke. A key is ``sk_<prefix>_<secret>``; only the secret's
SHA-256 is stored, so a key is shown once, when it is made."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from api.models import ApiKey
from operators import roles
from operators.models import AuditEntry, AuditOutcome, TenantScope
from operators.services.actions import Actor, Refused
from operators.services.limits import clip_text

KEY_PREFIX = "sk_"
# The console's actions on a key (staff only), as the audit log names them; object "apikey/<name>".
EXPIRE, REVOKE = "apikey.expire", "apikey.revoke"
USER_PREFIX = "api:"  # a key's own user; no person's username holds a colon... (see api_user_name)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def api_user_name(name: str) -> str:
    return f"{USER_PREFIX}{name}"


def apikey_create(
    *, name: str, role: str, tenants: list[str] | None = None, created_by: User | None = None,
    expires_at: datetime | None = None, rate_per_minute: int = 600,
) -> tuple[ApiKey, str]:
    """A new key and its plain text (shown once). ``role``: viewer, operator or approver;
    ``tenants``: the tenants it is limited to (None: every tenant)."""
    if role not in roles.ROLES:
        raise ValueError(f"role must be one of {', '.join(roles.ROLES)}")
    if ApiKey.objects.filter(name=name).exists():
        raise ValueError(f"an API key named {name!r} exists already")
    prefix, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    with transaction.atomic():
        user = get_user_model().objects.create(username=api_user_name(name), is_active=True)
        user.set_unusable_password()
        user.save(update_fields=["password"])
        roles.ensure_groups()
        user.groups.add(Group.objects.get(name=role))
        if tenants is not None:
            TenantScope.objects.create(user=user, tenants=tenants)
        key = ApiKey.objects.create(name=name, prefix=prefix, secret_hash=_hash(secret), user=user, role=role,
                                    created_by=created_by, expires_at=expires_at, rate_per_minute=rate_per_minute)
    return key, f"{KEY_PREFIX}{prefix}_{secret}"


def apikey_check(token: str) -> ApiKey | None:
    """The active key ``token`` is, or None (unknown, malformed, wrong secret, expired, revoked)."""
    if not token.startswith(KEY_PREFIX) or len(token) > 200:
        return None
    prefix, _, secret = token[len(KEY_PREFIX):].partition("_")
    if not prefix or not secret:
        return None
    key = ApiKey.objects.select_related("user").filter(prefix=prefix).first()
    if key is None or not hmac.compare_digest(key.secret_hash, _hash(secret)):
        return None
    if key.state != "ACTIVE" or not key.user.is_active:
        return None
    return key


def apikey_revoke(*, key: ApiKey, by: str) -> ApiKey:
    """Revoke ``key`` for good (its user is deactivated too)."""
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=key.pk)
        if key.revoked_at is None:
            key.revoked_at, key.revoked_by = timezone.now(), by
            key.save(update_fields=["revoked_at", "revoked_by"])
            key.user.is_active = False
            key.user.save(update_fields=["is_active"])
    return key


class NotStaff(Exception):
    """Only staff expire or revoke keys (HTTP 403)."""


def is_staff(user: User) -> bool:
    return bool(user.is_authenticated and (user.is_staff or user.is_superuser))


def apikey_snapshot(key: ApiKey) -> dict[str, object]:
    """What the audit log shows of a key before and after an action (never its hash)."""
    return {"state": key.state, "role": key.role,
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None, "revoked_by": key.revoked_by}


def _audit(actor: Actor, action: str, name: str, *, outcome: str, reason: str, before: object = None,
           after: object = None, message: str = "") -> None:
    AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=action, object_type="apikey", object_id=name,
        before=before, after=after, reason=clip_text(reason), ip=actor.ip, outcome=outcome,
        message=clip_text(message), tenant="",
    )


def apikey_end(*, actor: Actor, key_id: int, action: str, reason: str) -> ApiKey:
    """Expire a key now (``EXPIRE``) or revoke it (``REVOKE``) as ``actor``, audited in the same
    transaction as the change. ``NotStaff`` (audited as denied) unless ``actor`` is staff;
    ``ApiKey.DoesNotExist`` for no such key; ``Refused`` (audited) when the key is no longer active,
    or, to revoke, already revoked (an expired key may still be revoked: a revocation is final).
    A key that stops being ACTIVE is refused from its next request on (``apikey_check``)."""
    if action not in (EXPIRE, REVOKE):
        raise ValueError(f"unknown key action {action!r}")
    if not is_staff(actor.user):
        name = ApiKey.objects.filter(pk=key_id).values_list("name", flat=True).first() or str(key_id)
        _audit(actor, action, name, outcome=AuditOutcome.DENIED, reason=reason, message="staff required")
        raise NotStaff(f"{actor.label} may not {action.split('.')[1]} API keys: only staff may")
    try:
        with transaction.atomic():
            key = ApiKey.objects.select_for_update().select_related("user").get(pk=key_id)
            before = apikey_snapshot(key)
            if key.state == "REVOKED" or (action == EXPIRE and key.state == "EXPIRED"):
                raise Refused(f"key {key.name} is {key.state.lower()} already; nothing was changed")
            if action == EXPIRE:
                key.expires_at = timezone.now()
                key.save(update_fields=["expires_at"])
            else:
                key.revoked_at, key.revoked_by = timezone.now(), actor.label
                key.save(update_fields=["revoked_at", "revoked_by"])
                key.user.is_active = False
                key.user.save(update_fields=["is_active"])
            _audit(actor, action, key.name, outcome=AuditOutcome.OK, reason=reason, before=before,
                   after=apikey_snapshot(key))
            return key
    except Refused as exc:
        _audit(actor, action, key.name, outcome=AuditOutcome.REFUSED, reason=reason, before=before, message=str(exc))
        raise
