"""The audit log page and its CSV export: filters, keyset pages, streaming, and no way to change
an entry."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from console.user_audit import ACTION as ROLE_CHANGES
from operators.models import AuditEntry, AuditOutcome
from tests.console.conftest import client_for
from tests.console.queue_data import (
    audit,
    text,
)

pytestmark = pytest.mark.django_db


def test_it_filters_the_audit_log(people):
    a = audit(reason="evidence one")
    b = audit(actor_label="vera", outcome=AuditOutcome.DENIED, message="role operator required")
    c = audit(actor_label="ann", action="approval.approve", object_type="approval", object_id="7")
    client = client_for(people["viewer"])

    fixture = {str(pk) for pk in AuditEntry.objects.filter(action=ROLE_CHANGES).values_list("pk", flat=True)}

    def shown(**query) -> list[str]:
        """The entries listed, but for the fixture's role grants (console/user_audit.py)."""
        response = client.get(reverse("console:audit"), query)
        assert response.status_code == 200
        return [i for i in re.findall(r'id="audit-(\d+)"', text(response)) if i not in fixture]

    assert shown() == [str(c.id), str(b.id), str(a.id)]
    assert shown(actor="vera") == [str(b.id)]
    assert shown(outcome="denied") == [str(b.id)]
    assert shown(action="approval.approve") == [str(c.id)]
    assert shown(object_type="effect", object_id="1") == [str(b.id), str(a.id)]
    since = (timezone.now() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    before = (timezone.now() - timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%S")
    assert shown(since=since) == [str(c.id), str(b.id), str(a.id)]
    assert shown(until=before) == []
    bad = client.get(reverse("console:audit"), {"since": "yesterday-ish"})
    assert bad.status_code == 400 and "Enter a valid date/time" in text(bad)
    page = text(client.get(reverse("console:audit"), {"actor": "olga"}))
    assert "evidence one" in page and "/audit.csv?actor=olga" in page


def test_it_pages_the_audit_log_newest_first_by_keyset(people):
    AuditEntry.objects.bulk_create([
        AuditEntry(actor_label="olga", action="run.retry", object_type="run", object_id=str(i), outcome="ok")
        for i in range(80)
    ])
    client = client_for(people["viewer"])
    first = text(client.get(reverse("console:audit"), {"action": "run.retry"}))
    ids = [int(i) for i in re.findall(r'id="audit-(\d+)"', first)]
    assert len(ids) == 50 and ids == sorted(ids, reverse=True)
    next_url = re.search(r'href="([^"]+)" rel="next"', first).group(1).replace("&amp;", "&")
    assert "action=run.retry" in next_url
    second = [int(i) for i in re.findall(r'id="audit-(\d+)"', text(client.get(next_url)))]
    assert len(second) == 30 and max(second) < min(ids)


def test_it_exports_the_filtered_audit_log_as_csv(people):
    audit(reason="=HYPERLINK(\"http://evil\")", before={"state": "UNKNOWN", "card_number": "4111"},
          after={"state": "SUCCEEDED"})
    audit(actor_label="vera", outcome=AuditOutcome.DENIED)
    AuditEntry.objects.bulk_create([
        AuditEntry(actor_label="olga", action="run.retry", object_type="run", object_id=str(i), outcome="ok")
        for i in range(2500)
    ])
    client = client_for(people["viewer"])

    response = client.get(reverse("console:audit_csv"), {"actor": "olga", "action": "effect.resolve"})

    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 1
    row = rows[0]
    assert (row["actor"], row["action"], row["outcome"], row["object_id"]) == ("olga", "effect.resolve", "ok", "1")
    assert row["reason"] == "'=HYPERLINK(\"http://evil\")"  # a spreadsheet shows it, never runs it
    assert '"state": "UNKNOWN"' in row["before"] and "4111" not in row["before"]

    everything = client.get(reverse("console:audit_csv"))
    all_rows = list(csv.reader(io.StringIO(b"".join(everything.streaming_content).decode())))
    grants = AuditEntry.objects.filter(action=ROLE_CHANGES).count()  # the fixture's (console/user_audit.py)
    assert len(all_rows) == 1 + 2502 + grants  # header, then every entry: more than one chunk, no row limit
    assert client.get(reverse("console:audit_csv"), {"outcome": "nope"}).status_code == 400


def test_it_streams_the_csv_under_asgi_as_well(people):
    """Under daphne (ASGI) a synchronous body would be collected whole before sending."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    audit(reason="one")
    audit(reason="two", actor_label="vera")
    client = AsyncClient()

    async def fetch() -> tuple[int, bool, bool, str]:
        await client.aforce_login(people["viewer"])
        response = await client.get(reverse("console:audit_csv"), {"actor": "olga"})
        chunks = [chunk async for chunk in response.streaming_content]
        return response.status_code, response.streaming, response.is_async, b"".join(chunks).decode()

    status, streaming, is_async, body = async_to_sync(fetch)()
    assert status == 200 and streaming and is_async
    rows = list(csv.DictReader(io.StringIO(body)))
    assert [r["reason"] for r in rows] == ["one"]


def test_it_offers_no_way_to_change_an_audit_entry(people):
    entry = audit()
    client = client_for(people["operator"])
    assert client.post(reverse("console:audit"), {"id": entry.id}).status_code == 405
    assert client.post(reverse("console:audit_csv")).status_code == 405
