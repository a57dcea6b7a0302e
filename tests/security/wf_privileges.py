"""A workflow for the least-privilege test: a step, an effect through the ledger and an
approval, so a worker connected as the runtime role writes every engine table on its way."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ledger import Connector, connector
from sagas import Context, workflow


@connector("privileges.note")
class Note(Connector):
    """Needs no provider: answers with a reference derived from the key."""

    idempotent = True

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return {"id": f"note-{key[-8:]}", "text": payload["text"]}


@workflow("privileged_order", version=1)
def privileged_order(ctx: Context, order: dict) -> dict:
    total = ctx.step("price", lambda: 42)
    note = ctx.effect("note", "privileges.note", {"text": f"order {order['id']} costs {total}"})
    decision = ctx.approval("ship", reason=f"ship order {order['id']}?", timeout=timedelta(hours=1))
    return {"total": total, "note": note["id"], "approved_by": decision["by"]}
