"""Test data of the history timeline: journal entries written as the engine writes them, with
chosen times, kinds, names, workers and payloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sagas.models import JournalEntry, WorkflowRun

T0 = datetime(2026, 3, 4, 23, 59, 58, 345678, tzinfo=UTC)


def journal(run: WorkflowRun, *entries: tuple) -> None:
    """Append ``(kind, name, payload, worker, created_at)`` entries after the run's last one."""
    run.refresh_from_db()
    JournalEntry.objects.bulk_create(
        JournalEntry(run=run, seq=run.last_seq + i, kind=kind, name=name, payload=payload, worker_id=worker,
                     created_at=at)
        for i, (kind, name, payload, worker, at) in enumerate(entries, start=1)
    )
    WorkflowRun.objects.filter(id=run.id).update(last_seq=run.last_seq + len(entries))
    run.refresh_from_db()


def order_history(run: WorkflowRun, *, start: datetime = T0) -> None:
    """Twenty entries of an order run, as the demo writes them: start, claims, steps, four
    effects with their outcomes (one result about 40 KB), an approval and its decision."""
    w1, w2 = "worker-1@ops-a:4242", "worker-2@ops-b:977"
    at = iter(start + timedelta(milliseconds=ms) for ms in (
        0, 12, 31, 35, 412, 415, 420, 1_377, 1_390, 1_402, 1_405, 95_311, 95_330, 95_401, 95_406, 97_850, 97_902,
        97_905, 98_650, 98_700))
    order = {"order": "o-1042", "customer": "c-77", "amount_cents": 129_900, "currency": "EUR",
             "items": [{"sku": "KB-01", "qty": 1}, {"sku": "MS-02", "qty": 2}, {"sku": "CB-7", "qty": 3}]}

    def intent(connector: str, key: str) -> dict:
        return {"connector": connector, "key": key, "payload_hash": "9f2c" * 16, "reused": False}

    journal(
        run,
        ("started", "", {"input": order, "by": "olga"}, "", next(at)),
        ("claimed", "", {"fence": 1, "lease_seconds": 30}, w1, next(at)),
        ("step", "validate", {"value": {"ok": True, "checks": ["address", "stock", "fraud"], "score": 0.12}}, w1,
         next(at)),
        ("effect_intent", "charge", intent("payments.capture", "o-1042:charge"), w1, next(at)),
        ("effect_result", "charge", {"status": "SUCCEEDED", "downstream_ref": "ch_5f1a9e",
                                     "result": {"transaction_id": "tx-1042", "card": "4111 1111 1111 1111"}}, w1,
         next(at)),
        ("now", "", {"value": "2026-03-04T23:59:58.760000+00:00"}, w1, next(at)),
        ("effect_intent", "reserve", intent("stock.reserve", "o-1042:reserve"), w1, next(at)),
        ("effect_result", "reserve", {"status": "SUCCEEDED", "downstream_ref": "rs-88",
                                      "result": {"reserved": [{"sku": "KB-01", "bin": "A-3"}]}}, w1, next(at)),
        ("approval_requested", "ship", {"reason": "Irreversible: ship order o-1042",
                                        "deadline": "2026-03-05T04:00:00+00:00"}, w1, next(at)),
        ("yielded", "", {"waiting_for": "approval ship"}, w1, next(at)),
        ("suspended", "", {"until": "approval"}, w1, next(at)),
        ("approval_decided", "ship", {"approved": True, "by": "ann", "comment": "checked the address"}, "ann",
         next(at)),
        ("resumed", "", {"reason": "approval ship decided"}, "ann", next(at)),
        ("claimed", "", {"fence": 2, "lease_seconds": 30}, w2, next(at)),
        ("effect_intent", "ship", intent("carrier.ship", "o-1042:ship"), w2, next(at)),
        ("effect_result", "ship", {"status": "SUCCEEDED", "downstream_ref": "sh-1042",
                                   "result": {"label": ["row %04d of the carrier's label" % i for i in range(1200)],
                                              "last": "end-of-label"}}, w2, next(at)),
        ("effect_intent", "email", intent("email.send", "o-1042:email"), w2, next(at)),
        ("effect_result", "email", {"status": "FAILED_FINAL", "error_class": "Rejected",
                                    "message": "mailbox unavailable"}, w2, next(at)),
        ("step", "summarise", {"value": {"charged": 129_900, "shipped": True, "emailed": False}}, w2, next(at)),
        ("completed", "", {"value": {"order": "o-1042", "status": "shipped"}}, w2, next(at)),
    )
