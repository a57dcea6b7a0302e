"""Connectors to the simulated providers (``manage.py demo_providers``).

Each declares only what its provider really offers, so recovery does the right
thing for each kind of downstream system:

====================  ==========  ======  ==========  ============
connector             idempotent  lookup  compensate  irreversible
====================  ==========  ======  ==========  ============
``payments.capture``  yes         yes     refund      no   (refunds deduped by key)
``inventory.reserve`` no          yes     release     no
``email.send``        no          no      no          no
``shipping.create``   yes         yes     no          yes
``model.complete``    yes         no      no          no   (the gateway caches answers by key)
====================  ==========  ======  ==========  ============
"""

from __future__ import annotations

from typing import Any

from demo import client
from ledger import Connector, Outcome, connector


@connector("payments.capture")
class CapturePayment(Connector):
    """Captures ``{order, amount_cents, currency}``; the processor dedupes by key."""

    idempotent = True
    compensation_idempotent = True  # refunds are deduped by key too

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return client.call("POST", "/payments/capture", payload, key=key)

    def lookup(self, key: str) -> Outcome:
        return client.lookup("/payments/status/", key, "transaction_id")

    def manual_result(self, downstream_ref: str) -> dict[str, Any]:
        """An operator who found the charge in the processor's dashboard gives its id."""
        return {"transaction_id": downstream_ref, "resolved_manually": True}

    def compensate(self, payload: dict[str, Any], result: dict[str, Any], *, key: str) -> dict[str, Any]:
        """Refunds the whole capture; the refund is deduped by ``key`` too."""
        amount = result.get("amount_cents", payload.get("amount_cents"))
        refund = {"transaction_id": result["transaction_id"], "amount_cents": amount}
        return client.call("POST", "/payments/refund", refund, key=key)


@connector("inventory.reserve")
class ReserveStock(Connector):
    """Reserves ``{sku, qty}``. The inventory system records the key but reserves again on every call."""

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return client.call("POST", "/inventory/reserve", payload, key=key)

    def lookup(self, key: str) -> Outcome:
        return client.lookup("/inventory/status/", key, "reservation_id")

    def manual_result(self, downstream_ref: str) -> dict[str, Any]:
        return {"reservation_id": downstream_ref, "resolved_manually": True}

    def compensate(self, payload: dict[str, Any], result: dict[str, Any], *, key: str) -> dict[str, Any]:
        return client.call("POST", "/inventory/release", {"reservation_id": result["reservation_id"]}, key=key)


@connector("email.send")
class SendEmail(Connector):
    """Sends ``{to, subject, body}``. No keys, no status query: an unclear send needs a person."""

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return client.call("POST", "/email/send", payload, key=key)

    def manual_result(self, downstream_ref: str) -> dict[str, Any]:
        """An operator who found the message in the mail log gives its id as evidence."""
        return {"message_id": downstream_ref, "resolved_manually": True}


@connector("shipping.create")
class CreateShipment(Connector):
    """Creates a shipment for ``{order, address}``; deduped by key, and it cannot be cancelled."""

    idempotent = True
    irreversible = True

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return client.call("POST", "/shipping/create", payload, key=key)

    def lookup(self, key: str) -> Outcome:
        return client.lookup("/shipping/status/", key, "shipment_id")

    def manual_result(self, downstream_ref: str) -> dict[str, Any]:
        return {"shipment_id": downstream_ref, "resolved_manually": True}


@connector("model.complete")
class CompleteModel(Connector):
    """One billed completion ``{prompt, price}`` through a model gateway that caches answers
    by key: a retry with the same key is answered again without a second bill."""

    idempotent = True

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        return client.call("POST", "/model/complete", payload, key=key)

    def cost(self, payload: dict[str, Any], result: dict[str, Any]) -> float:
        """The completion's price, as the request names it (the gateway bills that)."""
        return float(payload.get("price") or 0.0)
