"""Roles are Django groups. Every action names the role it needs; the server checks it."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, Group, User

VIEWER, OPERATOR, APPROVER = "viewer", "operator", "approver"
ROLES = (VIEWER, OPERATOR, APPROVER)

# action -> the role allowed to do it (superusers may do everything)
ACTION_ROLES: dict[str, str] = {
    "run.start": OPERATOR,  # the HTTP API (api/); code inside the project calls sagas.start directly
    "run.signal": OPERATOR,
    "effect.query": OPERATOR,
    "effect.resolve": OPERATOR,
    "run.retry": OPERATOR,
    "run.cancel": OPERATOR,
    "run.compensate": OPERATOR,
    "run.pause": OPERATOR,
    "run.resume": OPERATOR,
    "run.move": OPERATOR,
    "run.redrive": OPERATOR,
    "run.fork": OPERATOR,
    "workflow.pause": OPERATOR,
    "workflow.resume": OPERATOR,
    "schedule.create": OPERATOR,
    "schedule.pause": OPERATOR,
    "schedule.resume": OPERATOR,
    "schedule.trigger": OPERATOR,
    "schedule.backfill": OPERATOR,
    "schedule.delete": OPERATOR,
    "connector.pause": OPERATOR,
    "connector.resume": OPERATOR,
    "connector.limits": OPERATOR,
    "connector.spend_limit": OPERATOR,  # a tenant's daily spend limit on a connector (own tenants only)
    "approval.approve": APPROVER,
    "approval.reject": APPROVER,
}


def ensure_groups() -> None:
    for name in ROLES:
        Group.objects.get_or_create(name=name)


def roles_of(user: User | AnonymousUser) -> set[str]:
    if not user.is_authenticated:
        return set()
    if user.is_superuser:
        return set(ROLES)
    cache = vars(user)
    if "_console_roles" not in cache:
        cache["_console_roles"] = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    roles: set[str] = cache["_console_roles"]
    return roles


def can(user: User | AnonymousUser, action: str) -> bool:
    return ACTION_ROLES[action] in roles_of(user)


def can_view(user: User | AnonymousUser) -> bool:
    """Anyone with a role may read every page (auditors are viewers)."""
    return bool(roles_of(user))
