"""A run's page: header, effects, approvals, the history a page at a time, the redacted JSON
export, and its live regions."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import AsyncClient
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console import live
from console.templatetags.console_tags import REDACTED
from ledger.models import EffectRecord, EffectStatus
from sagas import start
from sagas.models import (
    ApprovalRequest,
    RunStatus,
    WorkflowRun,
)
from tests.console.conftest import client_for
from tests.console.run_data import (
    IMG,
    IMG_ESCAPED,
    SCRIPT,
    SCRIPT_ESCAPED,
    append_entries,
    run_url,
    text,
    waiting_run,
)

pytestmark = pytest.mark.django_db


def test_it_shows_the_header_effects_approvals_and_actions_of_a_run(people):
    run = waiting_run("o-7", started_by=people["approver"], max_cost=2.5)
    page = text(client_for(people["operator"]).get(run_url(run)))

    assert 'id="live-run_header"' in page and "WAITING" in page and "rp_charge_ship_wait" in page
    assert run.definition_hash[:12] in page and "o-7" in page and "ann" in page  # started by
    assert "Fence" in page and "Attempts" in page and "2.5" in page  # budget limit
    charge = EffectRecord.objects.get(run_id=run.id, step_name="charge")
    assert charge.idempotency_key in page and "tx-o-7" in page and "rp.charge" in page
    approval = ApprovalRequest.objects.get(run=run)
    assert "Go on with order o-7?" in page and f'id="run-approval-{approval.id}"' in page
    assert 'name="expected" value="WAITING"' in page
    assert reverse("console:run_cancel", args=[run.id]) in page
    assert reverse("console:run_compensate", args=[run.id]) in page
    assert reverse("console:run_retry", args=[run.id]) not in page  # only for parked runs


def test_it_shows_run_actions_only_to_roles_that_may_take_them(people):
    run = waiting_run()
    viewer_page = text(client_for(people["viewer"]).get(run_url(run)))
    assert reverse("console:run_cancel", args=[run.id]) not in viewer_page
    assert reverse("console:run_compensate", args=[run.id]) not in viewer_page
    assert "your role cannot" in viewer_page
    approval = ApprovalRequest.objects.get(run=run)
    approver_page = text(client_for(people["approver"]).get(run_url(run)))
    assert f"/approvals/#approval-{approval.id}" in approver_page
    assert f"/approvals/#approval-{approval.id}" not in viewer_page


def test_it_links_an_unknown_effect_to_the_ambiguous_effects_page(people):
    run = waiting_run()
    unknown = EffectRecord.objects.create(
        tenant="default", idempotency_key=f"{run.id}:refund", run_id=run.id, step_name="refund",
        connector="rp.charge", request_payload={}, payload_hash="0" * 64, status=EffectStatus.UNKNOWN,
        intent_at=run.created_at, attempts=1, error_class="Timeout", error_message="no answer in 2 s",
    )
    page = text(client_for(people["viewer"]).get(run_url(run)))
    assert f"/effects/#effect-{unknown.id}" in page and "no answer in 2 s" in page
    charge = EffectRecord.objects.get(run_id=run.id, step_name="charge")
    assert f"/effects/#effect-{charge.id}" not in page  # settled effects need nobody


def test_it_shows_a_20000_entry_history_one_page_at_a_time(people):
    run = start("rp_plain", {})
    append_entries(run, 20_000)
    assert run.last_seq == 20_001
    client = client_for(people["viewer"])

    with CaptureQueriesContext(connection) as queries:
        page = text(client.get(run_url(run)))
    journal_reads = [q["sql"] for q in queries if 'FROM "sagas_journalentry"' in q["sql"]]
    history = [sql for sql in journal_reads if "LIMIT 101" in sql]
    repairs = [sql for sql in journal_reads if "operator_action" in sql]  # the run's repairs, listed on top
    assert len(history) == 1 and len(repairs) == 1 and len(journal_reads) == 2, journal_reads
    with connection.cursor() as cur:  # the repairs come from their own small index, not the 20,000 entries
        cur.execute("EXPLAIN " + repairs[0])
        plan = " ".join(row[0] for row in cur.fetchall())
    assert "journal_repairs" in plan, plan
    seqs = [int(s) for s in re.findall(r'<li class="entry kind-[a-z_]+" id="seq-(\d+)"', page)]
    assert seqs == list(range(20_001, 19_901, -1))
    more = reverse("console:run_history", args=[run.id]) + "?before=19902"
    assert f'href="{more}"' in page and f'hx-get="{more}"' in page

    fragment = text(client.get(more, HTTP_HX_REQUEST="true"))
    assert "<html" not in fragment
    assert [int(s) for s in re.findall(r'id="seq-(\d+)"', fragment)] == list(range(19_901, 19_801, -1))
    assert "?before=19802" in fragment

    last = text(client.get(reverse("console:run_history", args=[run.id]) + "?before=101", HTTP_HX_REQUEST="true"))
    assert [int(s) for s in re.findall(r'id="seq-(\d+)"', last)] == list(range(100, 0, -1))
    assert "?before=" not in last

    whole_page = client.get(more)  # without JavaScript: a page of its own
    assert whole_page.status_code == 200 and "<html" in text(whole_page) and "?before=19802" in text(whole_page)
    assert client.get(reverse("console:run_history", args=[run.id]) + "?before=x").status_code == 400


def test_it_escapes_hostile_payloads_and_redacts_secrets(people):
    run = start("rp_plain", {"note": IMG, "password": "hunter2"}, business_key=SCRIPT[:60])
    append_entries(run, 1, {"note": SCRIPT, "img": IMG, "password": "hunter2",
                            "nested": {"card": "4111 1111 1111 1111", "list": [{"api_key": "sk_live_42"}]}})
    append_entries(run, 1, {"long": IMG * 40, "token": "tok_secret_9"})
    WorkflowRun.objects.filter(id=run.id).update(
        status=RunStatus.NEEDS_ATTENTION, status_reason="workflow_error",
        error={"code": "workflow_error", "message": f"model said {SCRIPT}", "authorization": "Bearer abc"},
    )
    page = text(client_for(people["viewer"]).get(run_url(run)))

    assert SCRIPT not in page and IMG not in page
    assert SCRIPT_ESCAPED in page and IMG_ESCAPED in page
    for secret in ("hunter2", "4111 1111 1111 1111", "sk_live_42", "tok_secret_9", "Bearer abc"):
        assert secret not in page
    assert REDACTED in page
    assert "show all of it" in page  # the long payload: a preview, and the rest behind <details>


def test_it_exports_the_whole_history_as_redacted_json(people):
    run = start("rp_plain", {"card": "4111 1111 1111 1111"})
    append_entries(run, 2_500, {"password": "hunter2", "note": SCRIPT})
    response = client_for(people["viewer"]).get(run_url(run, "console:run_history_json"))

    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("application/json")
    assert f'filename="run-{run.id}-history.json"' in response["Content-Disposition"]
    body = b"".join(response.streaming_content).decode()
    data = json.loads(body)
    assert data["run"]["id"] == str(run.id) and data["run"]["input"]["card"] == "•••• 1111"  # a card: last 4
    assert [e["seq"] for e in data["entries"]] == list(range(1, 2_502))
    assert all(e["payload"]["password"] == REDACTED for e in data["entries"][1:])
    assert data["entries"][1]["payload"]["note"] == SCRIPT  # JSON, not HTML: kept as it was
    assert "hunter2" not in body and "4111" not in body


def test_it_streams_the_json_export_under_asgi_without_buffering_it(people):
    """Under daphne the export is an async iterator, each batch read in the request's thread."""
    run = start("rp_plain", {"password": "hunter2"})
    append_entries(run, 1_200, {"token": "tok_1"})

    async def download() -> tuple[object, list[bytes]]:
        client = AsyncClient()
        await client.aforce_login(people["viewer"])
        response = await client.get(run_url(run, "console:run_history_json"))
        return response, [chunk async for chunk in response.streaming_content]

    response, chunks = async_to_sync(download)()
    assert response.status_code == 200 and response.is_async
    assert len(chunks) >= 4  # the head, two batches of entries, the tail: streamed, not one buffer
    data = json.loads(b"".join(chunks))
    assert len(data["entries"]) == 1_201 and data["run"]["input"]["password"] == REDACTED
    assert b"tok_1" not in b"".join(chunks)


def test_it_renders_every_live_region_of_its_pages(people):
    run = waiting_run()
    user = people["viewer"]
    for name in ("run_header", "run_effects", "run_approvals", "run_compensation", "run_history"):
        html = live.render_fragment(name, user, {"run": str(run.id), "since": "0"})
        assert re.match(rf'\s*<[a-z]+ id="live-{name}"', html), name  # the root element carries the id
    assert re.match(r'\s*<[a-z]+ id="live-run_header"', live.render_fragment("run_header", user, {"run": "nonsense"}))

    table = live.render_fragment("runs_table", user, {"status": "WAITING", "after": ""})
    assert re.match(r'\s*<[a-z]+ id="live-runs_table"', table) and str(run.id) in table
    assert str(run.id) not in live.render_fragment("runs_table", user, {"status": "COMPLETED"})

    # The history region shows what was appended after the page's first history page, newest first.
    since = run.last_seq
    append_entries(run, 3, {"note": SCRIPT})
    fresh = live.render_fragment("run_history", user, {"run": str(run.id), "since": str(since)})
    assert re.findall(r'id="seq-(\d+)"', fresh) == [str(since + 3), str(since + 2), str(since + 1)]
    assert SCRIPT not in fresh and SCRIPT_ESCAPED in fresh


def test_it_subscribes_its_pages_to_their_live_regions(people):
    run = waiting_run()
    client = client_for(people["viewer"])
    page = text(client.get(reverse("console:runs"), {"status": "WAITING", "tenant": "default"}))
    assert re.search(r'ws-connect="/ws/live/\?fragments=runs_table&amp;status=WAITING&amp;tenant=default"', page)
    page = text(client.get(run_url(run)))
    subscribed = re.search(r'ws-connect="/ws/live/\?([^"]+)"', page).group(1).replace("&amp;", "&")
    assert "fragments=run_header%2Crun_actions%2Crun_history%2Crun_effects%2Crun_approvals%2Crun_compensation" in subscribed
    assert f"run={run.id}" in subscribed and f"since={run.last_seq}" in subscribed
