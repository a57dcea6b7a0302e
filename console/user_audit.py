"""Changes to who may do what are audited, wherever they are made, and end live sessions that
they revoke.

A user's *role state* is their groups, ``is_active``, ``is_staff``, ``is_superuser`` and tenant
limit (``TenantScope``; None: every tenant). Any change to it, made through the admin, a shell,
a management command or a test, writes one ``AuditEntry`` (action ``user.roles``, object
``user:<id>``, ``before`` and ``after`` the state, the message saying what moved), from the
model signals (``post_save`` of the user and of its tenant limit, ``m2m_changed`` of
``User.groups``, from either side). A new user gets an entry only if created with more than an
ordinary account has (staff, superuser, inactive). The entry is written while the change's
transaction is open: in the admin (``role_changes`` around the whole form, see
console/admin_users.py) and in any ``atomic`` block it commits or rolls back with the change;
a bare ``save()`` outside one commits first, as Django's own saves do.

Who: the user given to ``role_changes``/``acting_as`` (the admin passes the request's user);
otherwise the label given, else "system" (a shell, a migration, a test fixture).
Inside ``role_changes`` the changes of one form (the user, then its groups, then its tenant
limit) make one entry per user, compared at the end.

A password change, a deactivation or any role-state change also publishes the user's live
topic (``user.<id>``, after commit), so their open websockets check their access at once
(console/consumers.py): a changed password or deactivation closes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.db.models import QuerySet
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from console.broadcast import broadcast
from console.topics import user_topic
from operators.models import AuditEntry, AuditOutcome, TenantScope

ACTION = "user.roles"
SYSTEM = "system"
State = dict[str, Any]
_ROLE_FIELDS = frozenset({"is_active", "is_staff", "is_superuser"})
_WATCHED_FIELDS = _ROLE_FIELDS | {"password"}
ORDINARY: State = {"groups": [], "is_active": True, "is_staff": False, "is_superuser": False, "tenants": None}


@dataclass
class _Batch:
    actor: User | None
    label: str
    before: dict[int, State | None] = field(default_factory=dict)  # None: created in the batch


_actor: ContextVar[tuple[User | None, str] | None] = ContextVar("console_role_actor", default=None)
_batch: ContextVar[_Batch | None] = ContextVar("console_role_batch", default=None)


def _who() -> tuple[User | None, str]:
    current = _actor.get()
    if current is None:
        return None, SYSTEM
    return current


@contextmanager
def acting_as(user: User | None = None, *, label: str = "") -> Iterator[None]:
    """Role changes made inside are audited as made by ``user`` (or ``label``)."""
    token = _actor.set((user, user.get_username() if user is not None else (label or SYSTEM)))
    try:
        yield
    finally:
        _actor.reset(token)


@contextmanager
def role_changes(user: User | None = None, *, label: str = "", reason: str = "") -> Iterator[None]:
    """Collect the role changes made inside, as ``user`` (or ``label``), and write one entry per
    user whose role state differs at the end, with ``reason`` (why: e.g. the claims a sign-in
    brought). Use it inside the change's transaction."""
    with acting_as(user, label=label):
        actor, who = _who()
        batch = _Batch(actor=actor, label=who)
        token = _batch.set(batch)
        try:
            yield
        finally:
            _batch.reset(token)
        for pk, before in batch.before.items():
            _record(pk, before, actor, who, reason=reason)


def role_state(pk: int) -> State | None:
    """The user's role state as stored now (None: no such user)."""
    row = get_user_model().objects.filter(pk=pk).values(*sorted(_ROLE_FIELDS)).first()
    if row is None:
        return None
    scope = TenantScope.objects.filter(user_id=pk).values_list("tenants", flat=True).first()
    return {
        "groups": sorted(Group.objects.filter(user__pk=pk).values_list("name", flat=True)),
        **row,
        "tenants": None if scope is None else sorted(set(scope)),
    }


def _describe(before: State, after: State) -> str:
    parts = []
    added = sorted(set(after["groups"]) - set(before["groups"]))
    removed = sorted(set(before["groups"]) - set(after["groups"]))
    if added or removed:
        parts.append("groups " + " ".join([*(f"+{g}" for g in added), *(f"-{g}" for g in removed)]))
    for name in sorted(_ROLE_FIELDS):
        if before[name] != after[name]:
            parts.append(f"{name} {'on' if after[name] else 'off'}")
    if before["tenants"] != after["tenants"]:
        def show(t: list[str] | None) -> str:
            return "every tenant" if t is None else (", ".join(t) or "no tenant")

        parts.append(f"tenants: {show(before['tenants'])} -> {show(after['tenants'])}")
    return "; ".join(parts)


def _record(pk: int, before: State | None, actor: User | None, label: str, *, reason: str = "") -> None:
    after = role_state(pk)
    if after is None or after == (before or ORDINARY):
        return
    username = get_user_model().objects.filter(pk=pk).values_list("username", flat=True).first() or ""
    AuditEntry.objects.create(
        actor=actor, actor_label=label, action=ACTION, object_type="user", object_id=str(pk), before=before,
        after=after, outcome=AuditOutcome.OK, reason=reason,
        message=f"{username}: {'created with ' if before is None else ''}{_describe(before or ORDINARY, after)}",
    )
    broadcast(user_topic(pk))


# --- around each change: the state before it, then the entry -------------------------------------


def _before(pks: list[int], holder: Any) -> None:
    batch = _batch.get()
    states = {pk: role_state(pk) for pk in pks if batch is None or pk not in batch.before}
    if batch is not None:
        batch.before.update(states)
    else:
        holder.console_roles_before = states


def _after(holder: Any) -> None:
    if _batch.get() is not None:
        return  # written when the batch ends
    actor, label = _who()
    for pk, before in getattr(holder, "console_roles_before", {}).items():
        _record(pk, before, actor, label)
    holder.console_roles_before = {}


def _watched(update_fields: Any) -> bool:
    return update_fields is None or bool(set(update_fields) & _WATCHED_FIELDS)


def _user_pre_save(sender: Any, instance: Any, update_fields: Any = None, raw: bool = False, **kwargs: Any) -> None:
    if raw or instance.pk is None or not _watched(update_fields):
        instance.console_old_password = None
        return
    instance.console_old_password = (
        sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    )
    _before([instance.pk], instance)


def _user_post_save(sender: Any, instance: Any, created: bool, update_fields: Any = None, raw: bool = False,
                    **kwargs: Any) -> None:
    if raw:
        return
    if created:
        batch = _batch.get()
        if batch is not None:
            batch.before.setdefault(instance.pk, None)
        else:
            actor, label = _who()
            _record(instance.pk, None, actor, label)
        return
    if not _watched(update_fields):
        return
    old_password = getattr(instance, "console_old_password", None)
    if (old_password is not None and old_password != instance.password) or not instance.is_active:
        broadcast(user_topic(instance.pk))  # their open sockets check their session again
    _after(instance)


def _groups_changed(sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any) -> None:
    if reverse:  # group.user_set.add(...): the users are in pk_set (None on clear)
        pks = sorted(pk_set) if pk_set is not None else list(instance.user_set.values_list("pk", flat=True))
    else:
        pks = [instance.pk]
    if action in ("pre_add", "pre_remove", "pre_clear"):
        _before(pks, instance)
    elif action in ("post_add", "post_remove", "post_clear"):
        _after(instance)


def _limit_changed(raw: bool, origin: Any) -> bool:
    """A save or delete of the limit itself; not its cascade from deleting the user, which
    is the user's deletion, not a widening of their tenants."""
    if raw:
        return False
    model = origin.model if isinstance(origin, QuerySet) else type(origin)
    return origin is None or model is TenantScope


def _scope_before(sender: Any, instance: TenantScope, raw: bool = False, origin: Any = None, **kwargs: Any) -> None:
    if _limit_changed(raw, origin):
        _before([instance.user_id], instance)


def _scope_after(sender: Any, instance: TenantScope, raw: bool = False, origin: Any = None, **kwargs: Any) -> None:
    if _limit_changed(raw, origin):
        _after(instance)


def connect_signals() -> None:
    """Called by the app's ``ready``. Idempotent (dispatch_uid)."""
    user = get_user_model()
    pre_save.connect(_user_pre_save, sender=user, dispatch_uid="operators.roles.user_pre_save")
    post_save.connect(_user_post_save, sender=user, dispatch_uid="operators.roles.user_post_save")
    m2m_changed.connect(_groups_changed, sender=user.groups.through, dispatch_uid="operators.roles.groups")
    pre_save.connect(_scope_before, sender=TenantScope, dispatch_uid="operators.roles.scope_pre_save")
    post_save.connect(_scope_after, sender=TenantScope, dispatch_uid="operators.roles.scope_post_save")
    pre_delete.connect(_scope_before, sender=TenantScope, dispatch_uid="operators.roles.scope_pre_delete")
    post_delete.connect(_scope_after, sender=TenantScope, dispatch_uid="operators.roles.scope_post_delete")
