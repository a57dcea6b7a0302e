"""The providers' business actions. Each one validates, then executes and records, atomically.

Invariants:

* A refusal (``ProviderError``) executes and records nothing.
* An execution and its ``ProviderExecution`` row commit together, before the
  HTTP layer answers (and before any post-work fault acts).
* Deduplicating operations (payments, shipping) serialize on the key with a
  transaction-scoped advisory lock: concurrent requests with one key execute
  at most once; the others are replays of that execution. The same key with a
  different body is refused (422), never executed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from demo.models import ProviderExecution, ProviderReplay
from demo.providers.errors import ProviderError
from demo.providers.selectors import executions

CREATED = 201


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    replayed: bool = False


Work = Callable[[], dict[str, Any]]


# --- payments -----------------------------------------------------------------


def payment_capture(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    _require_key(key)
    order, amount, currency = _text(body, "order"), _positive_int(body, "amount_cents"), _currency(body)

    def work() -> dict[str, Any]:
        return {
            "transaction_id": _new_id("txn"), "status": "captured", "amount_cents": amount, "currency": currency,
            "order": order,
        }

    with transaction.atomic():
        return _deduped("payments", "capture", key=key, body=body, caller_pid=caller_pid, work=work)


def payment_status(*, key: str) -> Reply:
    capture = executions("payments", "capture", key).first()
    if capture is None:
        return _not_found(f"no capture with Idempotency-Key {key!r}")
    txn = capture.response["transaction_id"]
    return Reply(200, {
        "status": "succeeded", "transaction_id": txn, "response": capture.response,
        "refunded_cents": _refunded_cents(txn),
    })


def payment_refund(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    _require_key(key)
    txn, amount = _text(body, "transaction_id"), _positive_int(body, "amount_cents")

    def work() -> dict[str, Any]:
        capture = executions("payments", "capture").filter(response__transaction_id=txn).first()
        if capture is None:
            raise ProviderError(422, f"unknown transaction {txn!r}: nothing to refund")
        _lock("payments", "transaction", txn)
        captured, refunded = capture.response["amount_cents"], _refunded_cents(txn)
        if refunded + amount > captured:
            raise ProviderError(
                422, f"refund of {amount} exceeds what is left of transaction {txn!r} ({captured - refunded})"
            )
        return {"refund_id": _new_id("re"), "transaction_id": txn, "amount_cents": amount, "status": "refunded"}

    with transaction.atomic():
        return _deduped("payments", "refund", key=key, body=body, caller_pid=caller_pid, work=work)


def _refunded_cents(txn: str) -> int:
    refunds = executions("payments", "refund").filter(response__transaction_id=txn)
    return sum(refunds.values_list("response__amount_cents", flat=True))


# --- inventory (records the key, does not dedupe on it) -----------------------


def inventory_reserve(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    sku, qty = _text(body, "sku"), _positive_int(body, "qty")

    def work() -> dict[str, Any]:
        return {"reservation_id": _new_id("rsv"), "sku": sku, "qty": qty, "status": "reserved"}

    with transaction.atomic():
        return _execute("inventory", "reserve", key=key, body=body, caller_pid=caller_pid, work=work)


def inventory_status(*, key: str) -> Reply:
    reservations = executions("inventory", "reserve", key)
    first = reservations.first()
    if first is None:
        return _not_found(f"no reservation with Idempotency-Key {key!r}")
    rid = first.response["reservation_id"]
    return Reply(200, {
        "status": "succeeded", "reservation_id": rid, "response": first.response,
        "released": _released(rid), "executions": reservations.count(),
    })


def inventory_release(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    """Every call is an execution; releasing twice answers ``already_released: true``."""
    rid = _text(body, "reservation_id")

    def work() -> dict[str, Any]:
        if not executions("inventory", "reserve").filter(response__reservation_id=rid).exists():
            raise ProviderError(422, f"unknown reservation {rid!r}")
        _lock("inventory", "reservation", rid)
        return {"released": True, "reservation_id": rid, "already_released": _released(rid)}

    with transaction.atomic():
        return _execute("inventory", "release", key=key, body=body, caller_pid=caller_pid, work=work)


def _released(rid: str) -> bool:
    return executions("inventory", "release").filter(response__reservation_id=rid).exists()


# --- email (no keys, no status: every call sends) ------------------------------


def email_send(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    to, subject = _text(body, "to"), _text(body, "subject")
    if "@" not in to:
        raise ProviderError(422, f"'to' is not an email address: {to!r}")
    if not isinstance(body.get("body"), str):
        raise ProviderError(422, "'body' must be a string")

    def work() -> dict[str, Any]:
        return {"message_id": _new_id("msg"), "to": to, "subject": subject, "status": "sent"}

    with transaction.atomic():
        return _execute("email", "send", key=key, body=body, caller_pid=caller_pid, work=work)


# --- shipping (deduped, irreversible: there is no cancel) ---------------------


def shipping_create(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    _require_key(key)
    order = _text(body, "order")
    address = body.get("address")
    if not address or not isinstance(address, (str, dict)):
        raise ProviderError(422, "'address' must be a non-empty string or object")

    def work() -> dict[str, Any]:
        return {"shipment_id": _new_id("shp"), "order": order, "status": "created"}

    with transaction.atomic():
        return _deduped("shipping", "create", key=key, body=body, caller_pid=caller_pid, work=work)


def shipping_status(*, key: str) -> Reply:
    shipment = executions("shipping", "create", key).first()
    if shipment is None:
        return _not_found(f"no shipment with Idempotency-Key {key!r}")
    return Reply(200, {
        "status": "succeeded", "shipment_id": shipment.response["shipment_id"], "response": shipment.response,
    })


# --- model gateway (bills every call; a call with a key it has seen is answered from its cache, unbilled)


def model_complete(*, key: str, body: dict[str, Any], caller_pid: int | None) -> Reply:
    """A scripted language model behind a gateway. Each execution is one billed completion:
    its ``cost`` is the request's ``price``. Without an Idempotency-Key every call runs and is
    billed again; with one, a repeat is a replay of the first answer and costs nothing, as with
    gateways that cache completions by request key."""
    prompt, price = _text(body, "prompt"), _positive_number(body, "price")

    def work() -> dict[str, Any]:
        return {"completion_id": _new_id("cmpl"), "text": f"scripted answer to: {prompt[:80]}", "cost": price}

    with transaction.atomic():
        if key:
            return _deduped("model", "complete", key=key, body=body, caller_pid=caller_pid, work=work)
        return _execute("model", "complete", key=key, body=body, caller_pid=caller_pid, work=work)


# --- shared -------------------------------------------------------------------


def _execute(provider: str, operation: str, *, key: str, body: dict[str, Any], caller_pid: int | None,
             work: Work) -> Reply:
    response = work()
    ProviderExecution.objects.create(
        provider=provider, operation=operation, idempotency_key=key, request=body, response=response,
        status_code=CREATED, caller_pid=caller_pid,
    )
    return Reply(CREATED, response)


def _deduped(provider: str, operation: str, *, key: str, body: dict[str, Any], caller_pid: int | None,
             work: Work) -> Reply:
    """Execute once per key; later requests with the same key and body replay the first answer."""
    _lock(provider, operation, key)
    first = executions(provider, operation, key).first()
    if first is None:
        return _execute(provider, operation, key=key, body=body, caller_pid=caller_pid, work=work)
    if first.request != body:
        raise ProviderError(
            422, f"Idempotency-Key {key!r} was already used with a different request body; nothing was executed"
        )
    ProviderReplay.objects.create(execution=first, caller_pid=caller_pid)
    return Reply(first.status_code, first.response, replayed=True)


def _lock(*parts: str) -> None:
    """Serialize with every other transaction holding the same lock until this one ends."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["demo:" + "\x1f".join(parts)])


def _not_found(message: str) -> Reply:
    return Reply(404, {"status": "not_found", "error": message})


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _require_key(key: str) -> None:
    if not key:
        raise ProviderError(400, "the Idempotency-Key header is required")


def _text(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ProviderError(422, f"{field!r} must be a non-empty string")
    return value


def _positive_int(body: dict[str, Any], field: str) -> int:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ProviderError(422, f"{field!r} must be a positive integer")
    return value


def _positive_number(body: dict[str, Any], field: str) -> float:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ProviderError(422, f"{field!r} must be a positive number")
    return float(value)


def _currency(body: dict[str, Any]) -> str:
    value = body.get("currency")
    if not isinstance(value, str) or len(value) != 3 or not value.isalpha():
        raise ProviderError(422, "'currency' must be a three-letter code such as 'EUR'")
    return value.upper()
