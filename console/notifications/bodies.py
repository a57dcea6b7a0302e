"""What a notification says: one ``Item`` (something that needs a person), and the two bodies.

Every value taken from a run or a connector's call (business key, step names, error messages,
a circuit's key) goes through the redaction policy (``core.redaction``) before it is put in a
body; payloads, inputs and results are never put in at all. The link is to the console page
where a person acts. The Slack body escapes ``& < >`` in everything but its own link, so no
value can ping a channel or make a link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from console.notifications.models import NotificationFormat, NotificationKind
from core.redaction import redact_text

MAX_DETAIL = 300


@dataclass(frozen=True)
class Item:
    kind: str
    item: str  # effect:<id>, approval:<id>, run:<uuid> or circuit:<id>
    run_id: str | None  # None: about a connector's circuit, no run
    tenant: str  # "" with no run: a connector serves every tenant
    workflow: str
    business_key: str
    detail: str  # what exactly: the step, the connector, the error (redacted, short)
    path: str  # the console page to act on, from the site root
    facts: dict[str, Any] = field(default_factory=dict)  # more fields of the generic body (redacted)

    @property
    def link(self) -> str:
        return settings.CONSOLE_URL.rstrip("/") + self.path

    @property
    def summary(self) -> str:
        label = NotificationKind(self.kind).label
        if self.run_id is None:
            return f"{label}: {self.detail}"
        key = f", business key {self.business_key}" if self.business_key else ""
        return f"{label}: {self.detail} ({self.workflow} run {self.run_id[:8]}{key}, tenant {self.tenant})"


def clean(text: Any, limit: int = MAX_DETAIL) -> str:
    """Redacted, on one line, at most ``limit`` characters."""
    text = " ".join(redact_text(str(text or "")).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def body_for(item: Item, fmt: str, *, delivery_id: int) -> dict[str, Any]:
    if fmt == NotificationFormat.SLACK:
        text = f"Saga Console: {item.summary}"
        return {
            "text": _slack_escape(text),
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn",
                                             "text": f"*{_slack_escape(NotificationKind(item.kind).label)}*"
                                                     f"\n{_slack_escape(item.summary)}"}},
                {"type": "context", "elements": [
                    {"type": "mrkdwn",
                     "text": f"<{_slack_escape(item.link)}|Open in Saga Console> · delivery {delivery_id}"},
                ]},
            ],
        }
    return {
        "kind": item.kind,
        "item": item.item,
        "delivery": delivery_id,
        "run_id": item.run_id,
        "workflow": item.workflow,
        "tenant": item.tenant,
        "business_key": item.business_key,
        "summary": item.summary,
        "link": item.link,
        **item.facts,
    }
