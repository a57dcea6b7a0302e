"""The runs list, the run detail page and the run actions (cancel, retry, compensate), driven with
the Django test client against real PostgreSQL."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import AsyncClient, Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console import live
from console.models import AuditEntry, AuditOutcome
from console.selectors.paging import decode_cursor, encode_cursor
from console.selectors.runs import RunFilters, runs_page
from console.templatetags.console_tags import REDACTED
from ledger import Connector, connector
from ledger.models import EffectRecord, EffectStatus
from sagas import Context, start, workflow
from sagas.engine import advance
from sagas.models import (
    ApprovalRequest,
    CompensationItemState,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowRun,
)
from tests.console.conftest import client_for

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
IMG_ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"
RUN_LINK = re.compile(r'href="/runs/([0-9a-f-]{36})/"')


# --- workflows and connectors of this module ---------------------------------------------------


@connector("rp.charge")
class Charge(Connector):
    def execute(self, payload, *, key):
        return {"transaction_id": f"tx-{payload['order']}", "card": "4111 1111 1111 1111"}

    def compensate(self, payload, result, *, key):
        return {"refund_id": f"rf-{payload['order']}"}


@connector("rp.ship")
class Ship(Connector):
    irreversible = True

    def execute(self, payload, *, key):
        return {"shipment_id": f"sh-{payload['order']}"}


@workflow("rp_plain", version=1)
def rp_plain(ctx: Context, spec: dict) -> dict:
    return spec


@workflow("rp_charge_ship_wait", version=1, approve_irreversible=False)
def rp_charge_ship_wait(ctx: Context, order: dict) -> dict:
    ctx.effect("charge", "rp.charge", {"order": order["id"], "amount_cents": 500})
    ctx.effect("ship", "rp.ship", {"order": order["id"]})
    ctx.approval("go_on", reason=f"Go on with order {order['id']}?", timeout=timedelta(hours=1))
    return {"done": True}


def _noop(i: int) -> int:
    return i


@workflow("rp_budget", version=1, max_steps=1)
def rp_budget(ctx: Context, spec: dict) -> list:
    return [ctx.step("s", _noop, i) for i in range(3)]


# --- data ---------------------------------------------------------------------------------------




def text(response) -> str:
    return response.content.decode()


def listed(response) -> list[str]:
    """Run ids in the runs table, in page order."""
    assert response.status_code == 200
    return RUN_LINK.findall(text(response))


def waiting_run(order: str = "o-1", **options) -> WorkflowRun:
    """A WAITING run with two SUCCEEDED effects (charge, then the irreversible ship) and a
    PENDING approval."""
    run = start("rp_charge_ship_wait", {"id": order}, business_key=order, **options)
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    return run


def parked_run() -> WorkflowRun:
    run = start("rp_budget", {})
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "budget_exceeded")
    return run


def set_created(run: WorkflowRun, at: datetime) -> None:
    WorkflowRun.objects.filter(id=run.id).update(created_at=at)


def append_entries(run: WorkflowRun, count: int, payload: dict | None = None) -> None:
    """Append ``count`` journal entries after the run's last one, in one INSERT."""
    run.refresh_from_db()
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
               SELECT %s, %s + n, 'step', 'tick#' || n, %s::jsonb || jsonb_build_object('i', n), 'w:1', now()
                 FROM generate_series(1, %s) AS n""",
            [run.id, run.last_seq, json.dumps(payload or {}), count],
        )
    WorkflowRun.objects.filter(id=run.id).update(last_seq=run.last_seq + count)
    run.refresh_from_db()


def run_url(run: WorkflowRun, name: str = "console:run") -> str:
    return reverse(name, args=[run.id])


def act(client: Client, run: WorkflowRun, name: str, *, expected: str | None = None, **data) -> object:
    form = {"reason": "customer asked on ticket 4411", "expected": run.status if expected is None else expected}
    form.update(data)
    return client.post(reverse(f"console:run_{name}", args=[run.id]), form)


def audits(run: WorkflowRun, action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(object_type="run", object_id=str(run.id), action=action))


# --- access -------------------------------------------------------------------------------------


def test_it_sends_anonymous_visitors_to_the_login_page():
    run = start("rp_plain", {})
    anonymous = Client()
    for url in (reverse("console:runs"), run_url(run), run_url(run, "console:run_history"),
                run_url(run, "console:run_history_json"), run_url(run, "console:run_compensate")):
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("console:login")), url
    for name in ("cancel", "retry", "compensate"):
        assert act(anonymous, run, name).status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING and not AuditEntry.objects.exists()


def test_it_refuses_the_pages_to_an_account_without_a_console_role(people):
    run = start("rp_plain", {})
    client = client_for(people["nobody"])
    assert client.get(reverse("console:runs")).status_code == 403
    assert client.get(run_url(run)).status_code == 403
    assert client.get(run_url(run, "console:run_history_json")).status_code == 403


def test_it_answers_404_for_an_unknown_or_malformed_run_id(people):
    client = client_for(people["viewer"])
    assert client.get(reverse("console:run", args=[uuid.uuid4()])).status_code == 404
    assert client.get(reverse("console:run_history", args=[uuid.uuid4()])).status_code == 404
    assert client.get(reverse("console:run_history_json", args=[uuid.uuid4()])).status_code == 404
    assert client.get("/runs/not-a-run-id/").status_code == 404
    assert client.get("/runs/0123456789abcdef/").status_code == 404


# --- runs list ----------------------------------------------------------------------------------


def test_it_filters_runs_by_status_workflow_version_tenant_and_creation_time(people):
    acme = start("rp_plain", {"n": 1}, business_key="k-acme", tenant="acme")
    globex = start("rp_plain", {"n": 2}, business_key="k-globex", tenant="globex")
    parked = parked_run()
    set_created(acme, datetime(2026, 1, 10, 12, 0, tzinfo=dt_timezone.utc))
    set_created(globex, datetime(2026, 1, 12, 8, 30, tzinfo=dt_timezone.utc))
    client = client_for(people["viewer"])
    runs = reverse("console:runs")

    assert listed(client.get(runs)) == [str(parked.id), str(globex.id), str(acme.id)]
    assert listed(client.get(runs, {"status": "NEEDS_ATTENTION"})) == [str(parked.id)]
    assert listed(client.get(runs, {"status": "PENDING"})) == [str(globex.id), str(acme.id)]
    assert listed(client.get(runs, {"workflow": "rp_budget"})) == [str(parked.id)]
    assert listed(client.get(runs, {"workflow": "rp_plain", "version": "1"})) == [str(globex.id), str(acme.id)]
    assert listed(client.get(runs, {"workflow": "rp_plain", "version": "2"})) == []
    assert listed(client.get(runs, {"tenant": "acme"})) == [str(acme.id)]
    assert listed(client.get(runs, {"tenant": "acme", "status": "NEEDS_ATTENTION"})) == []
    # A date alone is the whole day; a date and time is exact.
    assert listed(client.get(runs, {"from": "2026-01-10", "to": "2026-01-10"})) == [str(acme.id)]
    assert listed(client.get(runs, {"from": "2026-01-10T12:00", "to": "2026-01-12T08:30"})) == [str(acme.id)]
    assert listed(client.get(runs, {"from": "2026-01-11"})) == [str(parked.id), str(globex.id)]
    assert listed(client.get(runs, {"to": "2026-01-12", "tenant": "globex"})) == [str(globex.id)]

    page = text(client.get(runs, {"status": "NEEDS_ATTENTION"}))
    assert "budget_exceeded" in page and "rp_budget" in page and '<option value="NEEDS_ATTENTION" selected>' in page


def test_it_finds_a_run_by_its_id_its_first_digits_or_its_business_key(people):
    first = start("rp_plain", {"n": 1}, business_key="order-1842")
    second = start("rp_plain", {"n": 2}, business_key="order-1843")
    other = start("rp_plain", {"n": 3}, business_key="refund-77")
    client = client_for(people["viewer"])
    runs = reverse("console:runs")

    assert listed(client.get(runs, {"q": str(other.id)})) == [str(other.id)]
    assert listed(client.get(runs, {"q": str(other.id).upper()})) == [str(other.id)]
    assert str(other.id) in listed(client.get(runs, {"q": str(other.id)[:8]}))
    assert listed(client.get(runs, {"q": "order-1842"})) == [str(first.id)]
    assert listed(client.get(runs, {"q": "order-18"})) == [str(second.id), str(first.id)]
    assert listed(client.get(runs, {"q": "order-%"})) == []  # LIKE wildcards are literal
    assert listed(client.get(runs, {"q": "nothing-like-it"})) == []


def test_it_pages_through_runs_newest_first_with_a_cursor_and_no_repeats(people):
    runs = [start("rp_plain", {"n": i}) for i in range(120)]
    # Half of them share one creation time: the id breaks the tie, so no row is lost or repeated.
    same = datetime(2026, 2, 1, 9, 0, tzinfo=dt_timezone.utc)
    WorkflowRun.objects.filter(id__in=[r.id for r in runs[:60]]).update(created_at=same)
    expected = [str(r.id) for r in WorkflowRun.objects.order_by("-created_at", "-id")]
    client = client_for(people["viewer"])

    seen: list[str] = []
    url = reverse("console:runs")
    pages = 0
    while url:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        page = listed(response)
        pages += 1
        assert len(page) == (50 if pages < 3 else 20)
        run_sql = [q["sql"] for q in queries if 'FROM "sagas_workflowrun"' in q["sql"]]
        assert all("OFFSET" not in sql and "COUNT(" not in sql for sql in run_sql)
        seen += page
        found = re.search(r'href="([^"]+)" rel="next"', text(response))
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert pages == 3 and seen == expected


def test_it_keeps_the_filters_in_the_next_page_link(people):
    for i in range(55):
        start("rp_plain", {"n": i}, tenant="acme" if i % 2 else "globex")
    client = client_for(people["viewer"])
    response = client.get(reverse("console:runs"), {"tenant": "acme", "status": "PENDING"})
    assert len(listed(response)) == 27 and 'rel="next"' not in text(response)
    response = client.get(reverse("console:runs"), {"status": "PENDING"})
    link = re.search(r'href="([^"]+)" rel="next"', text(response)).group(1).replace("&amp;", "&")
    assert "status=PENDING" in link and "after=" in link
    assert len(listed(client.get(link))) == 5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "BOGUS"}, "is not a run status"),
        ({"from": "yesterday"}, "is not a date or a time"),
        ({"to": "2026-13-45"}, "is not a date or a time"),
        ({"from": "2026-02-02", "to": "2026-02-01"}, "must be before"),
        ({"workflow": "rp_plain", "version": "two"}, "is not a version number"),
        ({"version": "1"}, "choose a workflow too"),
        ({"tenant": "x" * 201}, "longer than 200 characters"),
    ],
)
def test_it_answers_a_malformed_filter_with_a_message_and_no_rows(people, params, message):
    start("rp_plain", {})
    response = client_for(people["viewer"]).get(reverse("console:runs"), params)
    assert response.status_code == 200
    assert message in text(response) and listed(response) == []


def test_it_shows_the_first_page_for_a_damaged_cursor_or_a_bad_run_id(people):
    run = start("rp_plain", {}, business_key="bk-1")
    client = client_for(people["viewer"])
    for cursor in ("garbage", "123_not-a-uuid", f"99999999999999999999999_{run.id.hex}"):
        response = client.get(reverse("console:runs"), {"after": cursor})
        assert "The page link was damaged" in text(response) and listed(response) == [str(run.id)]
    response = client.get(reverse("console:runs"), {"q": "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"})
    assert "is not a valid run id" in text(response) and listed(response) == []


def test_it_pages_every_runs_filter_through_an_index(people):
    """Whatever the filters, a page is an index scan (EXPLAIN, with sequential scans disallowed
    so that a tiny test table cannot hide a missing index)."""
    run = start("rp_plain", {}, business_key="order-1")
    cursor = decode_cursor(encode_cursor(run.created_at, run.id), key=uuid.UUID)
    now = datetime.now(dt_timezone.utc)
    F = RunFilters
    combinations = [
        F(), F(status="FAILED"), F(workflow="rp_plain"), F(workflow="rp_plain", version=1), F(tenant="acme"),
        F(created_from=now - timedelta(days=1), created_to=now), F(search=str(run.id)), F(search="order-"),
        F(search=run.id.hex[:8]), F(status="FAILED", workflow="rp_plain", tenant="acme"),
        F(status="WAITING", created_from=now - timedelta(days=1)), F(tenant="acme", workflow="rp_plain", version=1),
    ]
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        for filters in combinations:
            for page_cursor in (None, cursor):
                with CaptureQueriesContext(connection) as queries:
                    runs_page(filters, cursor=page_cursor)
                cur.execute("EXPLAIN " + queries[-1]["sql"])
                plan = "\n".join(row[0] for row in cur.fetchall())
                assert "Seq Scan" not in plan, (filters, plan)
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'sagas_workflowrun'")
        indexes = {row[0] for row in cur.fetchall()}
    assert {"run_created_keyset", "run_status_created", "run_workflow_created", "run_workflow_version_created",
            "run_tenant_created", "run_business_key_prefix"} <= indexes


def test_it_escapes_hostile_business_keys_in_the_list(people):
    start("rp_plain", {}, business_key=IMG, tenant=SCRIPT[:100])
    page = text(client_for(people["viewer"]).get(reverse("console:runs")))
    assert IMG_ESCAPED in page and SCRIPT_ESCAPED in page
    assert IMG not in page and SCRIPT not in page


# --- run detail ---------------------------------------------------------------------------------


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
    assert len(journal_reads) == 1 and "LIMIT 101" in journal_reads[0]
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
    assert data["run"]["id"] == str(run.id) and data["run"]["input"]["card"] == REDACTED
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


# --- live fragments -----------------------------------------------------------------------------


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
    assert "fragments=run_header%2Crun_history%2Crun_effects%2Crun_approvals%2Crun_compensation" in subscribed
    assert f"run={run.id}" in subscribed and f"since={run.last_seq}" in subscribed


# --- actions ------------------------------------------------------------------------------------


def test_it_lets_an_operator_cancel_a_run_and_audits_it(people):
    run = waiting_run()
    client = client_for(people["operator"])
    response = act(client, run, "cancel")

    assert response.status_code == 302 and response["Location"] == run_url(run)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    [entry] = audits(run, "run.cancel")
    assert (entry.outcome, entry.actor_label, entry.reason) == (AuditOutcome.OK, "olga", "customer asked on ticket 4411")
    assert entry.before["state"] == "WAITING" and entry.after["state"] == "CANCELLED"
    assert "Run cancelled." in text(client.get(run_url(run)))
    assert JournalEntry.objects.filter(run=run, kind="cancelled").exists()


def test_it_cancels_with_compensation_when_asked(people):
    run = waiting_run()
    response = act(client_for(people["operator"]), run, "cancel", compensate="on")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
    assert CompensationPlan.objects.get(run=run).trigger == "cancel"


def test_it_lets_an_operator_retry_a_run_that_used_up_its_budget(people):
    run = parked_run()
    client = client_for(people["operator"])
    page = text(client.get(run_url(run)))
    assert reverse("console:run_retry", args=[run.id]) in page

    response = act(client, run, "retry")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING and run.max_steps == 2
    [entry] = audits(run, "run.retry")
    assert entry.outcome == AuditOutcome.OK and entry.before["state"] == "NEEDS_ATTENTION"


def test_it_previews_the_compensation_plan_and_starts_it_on_confirmation(people):
    run = waiting_run("o-9")
    client = client_for(people["operator"])

    preview = text(client.get(run_url(run, "console:run_compensate")))
    assert re.findall(r"<td>(ship|charge)</td>", preview) == ["ship", "charge"]  # newest first
    assert "IRREVERSIBLE" in preview and "reversible" in preview and "sh-o-9" in preview
    assert f"{run.id}:charge:compensate" in preview
    assert 'name="expected" value="WAITING"' in preview
    assert not CompensationPlan.objects.filter(run=run).exists()  # a preview writes nothing

    response = act(client, run, "compensate")
    assert response.status_code == 302 and response["Location"] == run_url(run)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATING
    [entry] = audits(run, "run.compensate")
    assert entry.outcome == AuditOutcome.OK and entry.after["state"] == "COMPENSATING"

    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPENSATED
    plan = CompensationPlan.objects.get(run=run)
    states = dict(plan.items.values_list("step_name", "state"))
    assert states == {"ship": CompensationItemState.IRREVERSIBLE, "charge": CompensationItemState.SUCCEEDED}
    page = text(client.get(run_url(run)))
    assert 'id="live-run_compensation"' in page and "nothing can undo it" in page and "Compensation started" in page


@pytest.mark.parametrize("name", ["cancel", "retry", "compensate"])
def test_it_denies_a_viewer_every_run_action_and_audits_the_attempt(people, name):
    run = parked_run()
    response = act(client_for(people["viewer"]), run, name)

    assert response.status_code == 403
    assert "needs the operator role" in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION
    [entry] = audits(run, f"run.{name}")
    assert entry.outcome == AuditOutcome.DENIED and entry.actor_label == "vera"


@pytest.mark.parametrize("name", ["cancel", "retry", "compensate"])
def test_it_refuses_an_action_on_a_run_that_changed_since_the_page_loaded(people, name):
    run = parked_run()
    response = act(client_for(people["operator"]), run, name, expected=RunStatus.WAITING)

    assert response.status_code == 409
    assert "it changed since you loaded the page" in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION and not CompensationPlan.objects.filter(run=run).exists()
    [entry] = audits(run, f"run.{name}")
    assert entry.outcome == AuditOutcome.REFUSED


def test_it_refuses_an_action_the_run_no_longer_allows(people):
    run = start("rp_plain", {})
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    response = act(client_for(people["operator"]), run, "cancel")
    assert response.status_code == 409 and "already COMPLETED" in text(response)


def test_it_requires_a_reason_and_the_status_seen(people):
    run = waiting_run()
    client = client_for(people["operator"])
    assert act(client, run, "cancel", reason="  ").status_code == 400
    assert act(client, run, "cancel", expected="").status_code == 400
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and not audits(run, "run.cancel")


def test_it_refuses_an_action_without_a_csrf_token(people):
    run = waiting_run()
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    assert act(client, run, "cancel").status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_it_answers_htmx_with_the_actions_region_and_the_new_header(people):
    run = waiting_run()
    client = client_for(people["operator"])

    response = client.post(reverse("console:run_cancel", args=[run.id]),
                           {"reason": "duplicate order", "expected": "WAITING"}, HTTP_HX_REQUEST="true")
    html = text(response)
    assert response.status_code == 200 and "<html" not in html
    assert 'id="run-actions"' in html and "Run cancelled." in html
    assert 'id="live-run_header" class="run-header" hx-swap-oob="true"' in html and "CANCELLED" in html

    stale = client.post(reverse("console:run_cancel", args=[run.id]),
                        {"reason": "again", "expected": "WAITING"}, HTTP_HX_REQUEST="true")
    assert stale.status_code == 409 and 'id="run-actions"' in text(stale)
    assert "it changed since you loaded the page" in text(stale)
