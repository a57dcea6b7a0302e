"""``system.notify``: sends one notification delivery, as a ledgered effect.

Started by ``console.notifications.detect`` with the business key ``delivery-<id>`` (so a second
start returns the same run), in the tenant of the item it is about. Its one effect, ``post``
(connector ``webhook.post``), is what makes a crash safe: the ledger records the intent before
the POST and the outcome after it, and an outcome it cannot know is UNKNOWN (the run waits in
NEEDS_ATTENTION for a person), never a second POST. A delivery that fails for good (a 4xx, an
endpoint deactivated, retries spent) completes the run with ``delivered: false``: the
deliveries page shows it as failed, and nothing is compensated (a notification cannot be undone).
"""

from __future__ import annotations

from console.notifications.selectors import delivery_message
from ledger import EffectFailed
from sagas import Context, workflow


@workflow("system.notify", version=1, max_steps=10)
def notify(ctx: Context, input: dict) -> dict:
    message = ctx.step("load", delivery_message, input["delivery"])
    try:
        answer = ctx.effect("post", "webhook.post", message)
    except EffectFailed as exc:
        return {"delivered": False, "delivery": input["delivery"], "error": str(exc)[:500]}
    return {"delivered": True, "delivery": input["delivery"], "status": answer.get("status")}
