"""Who the audit log names: a person (their username) or an automated actor, named
``system: <name>`` (the demo's approver bot, the reconciler, createuser, batch jobs ...).

Usernames cannot hold a space (Django's username validator), so no person's name reads as a
system actor's.
"""

from __future__ import annotations

SYSTEM = "system"
_PREFIX = f"{SYSTEM}: "


def system_label(name: str) -> str:
    """``"system: <name>"`` for an automated actor (``"system"`` if it has no name)."""
    name = name.strip()
    if not name or name == SYSTEM:
        return SYSTEM
    return name if name.startswith(_PREFIX) else f"{_PREFIX}{name}"


def is_system_label(label: str) -> bool:
    return label == SYSTEM or label.startswith(_PREFIX)
