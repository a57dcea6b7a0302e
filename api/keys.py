"""API keys: create, check, revoke. A key is ``sk_<prefix>_<secret>``; only the secret's
SHA-256 is stored, so a key is shown once, when it is made."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import transaction
from django.utils import timezone

from api.models import ApiKey
from console import roles
from console.models import TenantScope

KEY_PREFIX = "sk_"
USER_PREFIX = "api:"  # a key's own user; no person's username holds a colon... (see api_user_name)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def api_user_name(name: str) -> str:
    return f"{USER_PREFIX}{name}"


def apikey_create(
    *, name: str, role: str, tenants: list[str] | None = None, created_by: AbstractBaseUser | None = None,
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
