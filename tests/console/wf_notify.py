"""A workflow for the notification tests: one email (``email.send``: no lookup, no dedupe), so a
timeout leaves it UNKNOWN and the run NEEDS_ATTENTION."""

from __future__ import annotations

from sagas import Context, workflow


@workflow("nt_email", version=1)
def nt_email(ctx: Context, order: dict) -> str:
    ctx.effect("email", "email.send", {"to": "customer@example.com", "subject": f"order {order['id']}",
                                       "body": "on its way"})
    return "sent"
