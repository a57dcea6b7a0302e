"""What the audit log keeps of free text: every attempt is recorded, whatever was sent, and none
can bloat the append-only log or fail to be stored."""

from __future__ import annotations

AUDIT_TEXT_CHARS = 4000  # what one audit entry keeps of a reason or a message


def clip_text(text: object, limit: int = AUDIT_TEXT_CHARS) -> str:
    """``text`` as the audit log stores it: NUL characters removed (PostgreSQL cannot store them)
    and anything past ``limit`` characters cut, with a marker that says how long it was
    (at most ``limit`` + 30 characters in all)."""
    text = str(text or "").replace("\x00", "")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut, {len(text)} chars]"
