"""An agent run on its page: the conversation, one row per model turn (the model's text, its
tool calls with their ledger status and approvals, tokens and cost), redacted, long content
folded, read in a number of queries that does not grow with the turns, and live."""

from __future__ import annotations

import asyncio
import re
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from config.asgi import application
from console import broadcast as live_broadcast
from console import live
from console.selectors.conversation import conversation
from console.views import run_detail
from core.redaction import MARK
from ledger.models import EffectRecord
from sagas import approve, reject
from sagas.models import ApprovalRequest, JournalEntry, RunStatus
from sagas.replay.engine import advance
from tests.console.conftest import client_for
from tests.console.conversation_data import agent_run, version_registered
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

SECRET = "sk-live-4f9a8b7c6d5e"
PRICES = {"cv-scripted": [1000.0, 2000.0]}  # usd per million tokens: large, so every turn costs something
LONG_ANSWER = "All done: " + "the order was looked up, paid, shipped and the customer told. " * 12 + "END-OF-ANSWER"


def section(page: str) -> str:
    start = page.index('<section id="live-run_conversation"')
    return page[start:page.index("</section>", start)]


def turns_of(html: str) -> dict[int, str]:
    """Turn number -> the HTML of its row."""
    rows = re.split(r'<li class="turn" id="turn-\d+">', html)[1:]
    return {int(re.search(r"<strong>Turn (\d+)</strong>", row).group(1)): row for row in rows}


def model_turns(run) -> list[dict]:
    return [e.payload["value"] for e in JournalEntry.objects.filter(run=run, name__startswith="order.model")
            .order_by("seq")]


@pytest.fixture
def order_run(people, settings):
    """Five turns: a lookup (hostile text, a secret argument), a payment and a second lookup, an
    irreversible shipment approved by ann, a notification rejected by abe, and a long answer."""
    settings.SAGAS_MODEL_PRICES = PRICES
    run = agent_run([
        {"text": f"Looking the order up {SCRIPT}",
         "calls": [["lookup_order", {"order": "o-1", "api_key": SECRET, "note": IMG}]]},
        {"calls": [["capture_payment", {"order": "o-1", "amount_cents": 500}], ["lookup_order", {"order": "o-1"}]]},
        {"text": "Shipping it.", "calls": [["ship_order", {"order": "o-1"}]]},
        {"calls": [["notify_customer", {"order": "o-1", "message": "Your order shipped"}]]},
    ], final=LONG_ANSWER, started_by=people["operator"])
    approve(run_id=run.id, name="approve:ship_order", user=people["approver"], comment="ok, ship it")
    advance(str(run.id), owner="t")
    reject(run_id=run.id, name="order.approve.notify_customer", user=people["approver2"], comment="no spam")
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def test_it_shows_an_agent_run_as_one_row_per_turn(people, order_run):
    page = text(client_for(people["viewer"]).get(run_url(order_run)))
    html = section(page)
    turns = turns_of(html)
    assert sorted(turns) == [1, 2, 3, 4, 5]
    assert "Conversation" in html and "cv-scripted" in turns[1]

    # The first turn shows what the agent was told and asked, and what the model said.
    assert "Instructions" in turns[1] and "You handle orders." in turns[1]
    assert "Order o-1: handle it" in turns[1]
    assert "Instructions" not in turns[2]
    assert "Looking the order up" in turns[1] and "Shipping it." in turns[3]

    # Each tool call with its arguments and what it returned.
    assert turns[2].count('class="tool-call"') == 2
    assert "&quot;amount_cents&quot;: 500" in turns[2] and "tx-o-1" in turns[2]
    assert "Returned" in turns[1] and "&quot;status&quot;: &quot;paid&quot;" in turns[1]


def test_it_links_an_effect_tool_call_to_its_ledger_record(people, order_run):
    page = text(client_for(people["viewer"]).get(run_url(order_run)))
    turns = turns_of(section(page))
    payment = EffectRecord.objects.get(run_id=order_run.id, step_name="capture_payment")
    shipment = EffectRecord.objects.get(run_id=order_run.id, step_name="ship_order")
    assert f'<a class="badge SUCCEEDED" href="#run-effect-{payment.id}"' in turns[2]
    assert f'<a class="badge SUCCEEDED" href="#run-effect-{shipment.id}"' in turns[3]
    assert f'id="run-effect-{payment.id}"' in page  # the link lands on the effects section's row
    assert "via <bdi>cv.charge</bdi>" in turns[2]
    # A plain tool is a step: it links to its journal entry instead.
    lookup = JournalEntry.objects.get(run=order_run, name="order.tool.lookup_order")
    assert f"?seq={lookup.seq}" in turns[1] and "badge" not in turns[1].split("Tool call", 1)[1].split("</div>")[0]


def test_it_shows_approvals_inline_with_who_decided(people, order_run):
    turns = turns_of(section(text(client_for(people["viewer"]).get(run_url(order_run)))))
    shipped = ApprovalRequest.objects.get(run=order_run, step="approve:ship_order")
    assert f'<a class="badge APPROVED" href="#run-approval-{shipped.id}">APPROVED</a>' in turns[3]
    assert 'by <bdi class="tool-decider">ann</bdi>' in turns[3] and "ok, ship it" in turns[3]

    # The rejected notification never ran; the model was told who said no.
    assert "REJECTED" in turns[4] and 'by <bdi class="tool-decider">abe</bdi>' in turns[4]
    assert "Denied" in turns[4] and "rejected by abe: no spam" in turns[4]
    assert not JournalEntry.objects.filter(run=order_run, name__startswith="order.tool.notify").exists()


def test_it_shows_tokens_and_cost_per_turn_and_the_run_total(people, order_run):
    html = section(text(client_for(people["viewer"]).get(run_url(order_run))))
    turns = turns_of(html)
    recorded = model_turns(order_run)
    for value in recorded:
        usage = value["usage"]
        row = turns[value["turn"]]
        assert f"{usage['input_tokens']} in / {usage['output_tokens']} out tokens" in row
        expected = (usage["input_tokens"] * 1000 + usage["output_tokens"] * 2000) / 1_000_000
        assert f"{Decimal(str(expected)).normalize():f} usd" in row
    total_in = sum(v["usage"]["input_tokens"] for v in recorded)
    total_out = sum(v["usage"]["output_tokens"] for v in recorded)
    total = re.search(r'<p class="conversation-total">(.*?)</p>', html, re.S).group(1)
    assert "5 turns" in total and f"{total_in} in / {total_out} out tokens" in total
    assert f"{order_run.cost_used.normalize():f} usd" in total  # what the run's budget was charged
    assert "unpriced" not in html


def test_it_says_a_turn_is_unpriced_when_its_model_has_no_price(people, settings):
    settings.SAGAS_MODEL_PRICES = {"other-model": [1.0, 1.0]}
    run = agent_run([{"calls": [["lookup_order", {"order": "o-2"}]]}], final="Done.")
    html = section(text(client_for(people["viewer"]).get(run_url(run))))
    turns = turns_of(html)
    assert all('<span class="turn-cost">unpriced</span>' in turns[n] for n in (1, 2))
    assert '<span class="total-cost">unpriced</span>' in html


def test_it_totals_the_priced_turns_and_counts_the_others(people, settings):
    settings.SAGAS_MODEL_PRICES = {}
    run = agent_run([{"calls": [["ship_order", {"order": "o-2"}]]}], final="Done.", started_by=people["operator"])
    settings.SAGAS_MODEL_PRICES = PRICES  # priced from the second turn on, after the approval
    approve(run_id=run.id, name="approve:ship_order", user=people["approver"])
    advance(str(run.id), owner="t")
    turns = model_turns(run)
    assert [t["priced"] for t in turns] == [False, True]
    html = section(text(client_for(people["viewer"]).get(run_url(run))))
    assert '<span class="turn-cost">unpriced</span>' in turns_of(html)[1]
    assert f'<span class="total-cost">{turns[1]["cost"]} usd (1 turn unpriced)</span>' in html


def test_it_escapes_hostile_html_and_redacts_secrets(people, order_run):
    page = text(client_for(people["viewer"]).get(run_url(order_run)))
    turns = turns_of(section(page))
    assert SCRIPT_ESCAPED in turns[1]  # the model's text
    assert IMG_ESCAPED in turns[1]  # a tool argument
    assert SCRIPT not in page and IMG not in page
    assert f"&quot;api_key&quot;: &quot;{MARK}&quot;" in turns[1]
    assert SECRET not in page


def test_it_folds_long_content(people, order_run):
    page = text(client_for(people["viewer"]).get(run_url(order_run)))
    last = turns_of(section(page))[5]
    folded = re.search(r'<details class="conv-long turn-said"><summary>(.*?)</summary>(.*?)</details>', last, re.S)
    assert folded and folded.group(1).startswith("All done: the order was looked up")
    assert f"({len(LONG_ANSWER)} characters)" in folded.group(1)
    final = JournalEntry.objects.filter(run=order_run, name="order.model#5").get()
    assert reverse("console:run_item_payload", args=[order_run.id, "entry", final.seq]) in folded.group(2)
    assert "END-OF-ANSWER" not in page  # past the preview: only behind the link
    assert "<details" not in turns_of(section(page))[3]  # short content is shown inline


def test_it_shows_an_unknown_effect_with_a_link_to_decide_it(people):
    run = agent_run([{"calls": [["refund_payment", {"order": "o-3"}]]}])
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "effect_unknown")
    turns = turns_of(section(text(client_for(people["viewer"]).get(run_url(run)))))
    refund = EffectRecord.objects.get(run_id=run.id, step_name="refund_payment")
    assert f'<a class="badge UNKNOWN" href="#run-effect-{refund.id}"' in turns[1]
    assert f'href="/effects/#effect-{refund.id}">decide it in ambiguous effects' in turns[1]
    assert "No result yet" in turns[1]


def test_it_shows_a_call_waiting_for_approval(people):
    run = agent_run([{"calls": [["ship_order", {"order": "o-4"}]]}], started_by=people["operator"])
    assert run.status == RunStatus.WAITING
    turns = turns_of(section(text(client_for(people["viewer"]).get(run_url(run)))))
    waiting = ApprovalRequest.objects.get(run=run, step="approve:ship_order")
    assert f'<a class="badge PENDING" href="#run-approval-{waiting.id}">PENDING</a>' in turns[1]
    assert "No result yet" in turns[1] and "tool-decider" not in turns[1]
    assert not EffectRecord.objects.filter(run_id=run.id).exists()


def test_it_shows_no_conversation_for_a_run_without_agent_turns(people):
    page = text(client_for(people["viewer"]).get(run_url(waiting_run())))
    assert 'id="live-run_conversation"' in page  # the live region, empty until the run has turns
    assert "run-conversation-title" not in page and "Conversation" not in page


def _script(n: int) -> list[dict]:
    return [{"text": f"Turn {i} thinks", "calls": [["lookup_order", {"order": f"o-{i}"}],
                                                   ["capture_payment", {"order": f"o-{i}", "amount_cents": i}]]}
            for i in range(1, n)]


def test_it_reads_the_conversation_in_a_number_of_queries_independent_of_the_turns(
    people, django_assert_max_num_queries,
):
    client = client_for(people["viewer"])
    counts = {}
    for n in (2, 20):
        run = agent_run(_script(n), final=f"done after {n}")
        with django_assert_max_num_queries(3):  # the steps, the approvals, the effects
            assert len(conversation(run.id).turns) == n
        client.get(run_url(run))  # the session and the user are read once; the next page is the same
        with CaptureQueriesContext(connection) as queries:
            page = text(client.get(run_url(run)))
        assert len(turns_of(section(page))) == n
        assert section(page).count("badge SUCCEEDED") == n - 1
        counts[n] = len(queries)
    assert counts[2] == counts[20], counts


def test_it_refreshes_the_conversation_with_the_run(people):
    run = agent_run([{"calls": [["ship_order", {"order": "o-5"}]]}], final="Shipped.",
                    started_by=people["operator"])
    page = text(client_for(people["viewer"]).get(run_url(run)))
    assert "run_conversation" in re.search(r'ws-connect="([^"]+)"', page).group(1)  # the page follows it
    params = {"run": str(run.id)}
    before = run_detail.run_conversation_fragment(people["viewer"], params)
    assert before.startswith('<section id="live-run_conversation"') and len(turns_of(before)) == 1
    assert "PENDING" in before

    approve(run_id=run.id, name="approve:ship_order", user=people["approver"])
    advance(str(run.id), owner="t")
    after = run_detail.run_conversation_fragment(people["viewer"], params)
    assert sorted(turns_of(after)) == [1, 2] and "APPROVED" in after and "Shipped." in after
    assert "badge SUCCEEDED" in after


def test_it_finds_the_conversation_of_a_long_run_and_reads_one_journal_page_of_other_runs(people):
    client = client_for(people["viewer"])
    agent = agent_run([{"calls": [["lookup_order", {"order": "o-6"}]]}], final="Looked up.")
    version_registered()  # its module, which runs an agent (run_agent), is how the page knows
    append_entries(agent, 150)  # the agent's entries are no longer on the history's first page
    assert len(turns_of(section(text(client.get(run_url(agent)))))) == 2

    plain = waiting_run()
    append_entries(plain, 150)
    with CaptureQueriesContext(connection) as queries:
        page = text(client.get(run_url(plain)))
    assert "run-conversation-title" not in page
    journal_reads = [q["sql"] for q in queries if 'FROM "sagas_journalentry"' in q["sql"]]
    history = [sql for sql in journal_reads if "LIMIT 101" in sql]  # the history's first page
    repairs = [sql for sql in journal_reads if "operator_action" in sql]  # its repairs, from their own index
    assert len(history) == 1 and len(repairs) == 1 and len(journal_reads) == 2, journal_reads  # nothing more


@pytest.mark.django_db(transaction=True)
def test_it_pushes_the_conversation_to_an_open_run_page(people):
    """Over the live websocket, as console/live.py serves the run page's other regions."""
    run = agent_run([{"calls": [["ship_order", {"order": "o-7"}]]}], final="Shipped o-7.",
                    started_by=people["operator"])
    browser = Client()
    browser.force_login(people["viewer"])
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    async def scenario():
        socket = WebsocketCommunicator(application, f"/ws/live/?fragments=run_conversation&run={run.id}",
                                       headers=[(b"origin", b"http://localhost"), (b"cookie", cookie)])
        connected, _ = await socket.connect(timeout=5)
        assert connected
        first = await socket.receive_from(timeout=5)
        assert 'id="live-run_conversation"' in first and "PENDING" in first and "Shipped o-7." not in first

        await database_sync_to_async(approve)(run_id=run.id, name="approve:ship_order", user=people["approver"])
        await database_sync_to_async(advance)(str(run.id), owner="t")
        await database_sync_to_async(live_broadcast.publisher.flush)()
        deadline = asyncio.get_running_loop().time() + 5
        pushed = ""
        while "Shipped o-7." not in pushed:
            remaining = deadline - asyncio.get_running_loop().time()
            assert remaining > 0, f"no push with the new turn; last: {pushed[:300]}"
            try:
                pushed = await socket.receive_from(timeout=remaining)
            except TimeoutError:
                continue
        assert sorted(turns_of(pushed)) == [1, 2] and "APPROVED" in pushed
        await socket.disconnect()

    async_to_sync(scenario)()


def test_it_shows_a_failed_model_request(people):
    run = agent_run([{"calls": [["lookup_order", {"order": "o-8"}]]}, {"fail": "gateway said 503 <b>busy</b>"}])
    assert run.status == RunStatus.FAILED
    turns = turns_of(section(text(client_for(people["viewer"]).get(run_url(run)))))
    assert sorted(turns) == [1, 2]
    assert "model request failed" in turns[2] and "gateway said 503 &lt;b&gt;busy&lt;/b&gt;" in turns[2]
    assert "turn-tokens" not in turns[2]
    assert '<span class="total-cost">unpriced</span>' in turns[2]  # the failed request cost nothing known


def test_it_matches_each_call_with_the_tool_run_it_caused(people):
    """A call the model got wrong (its arguments failed validation) never ran: the first
    lookup entry is the second call's, and the model was asked to retry the first."""
    run = agent_run([
        {"calls": [["lookup_order", {"reference": "o-9"}]]},
        {"calls": [["lookup_order", {"order": "o-9"}]]},
        {"calls": [["lookup_order", {"order": "o-10"}]]},
    ])
    assert run.status == RunStatus.COMPLETED
    turns = turns_of(section(text(client_for(people["viewer"]).get(run_url(run)))))
    first, second = (JournalEntry.objects.get(run=run, name=name).seq
                     for name in ("order.tool.lookup_order", "order.tool.lookup_order#2"))
    assert "Asked the model to retry" in turns[1] and "?seq=" not in turns[1].split("turn-calls", 1)[1]
    assert f"?seq={first}" in turns[2] and "o-9" in turns[2].split("Returned", 1)[1]
    assert f"?seq={second}" in turns[3] and "o-10" in turns[3].split("Returned", 1)[1]


def test_it_shows_a_structured_output_as_the_last_turns_output(people):
    run = agent_run([{"calls": [["lookup_order", {"order": "o-11"}]]}], final={"order": "o-11", "shipped": False})
    assert run.status == RunStatus.COMPLETED and run.result == {"order": "o-11", "shipped": False}
    last = turns_of(section(text(client_for(people["viewer"]).get(run_url(run)))))[2]
    assert '<span class="turn-label">Output</span>' in last and "&quot;shipped&quot;: false" in last
    assert "tool-call" not in last and "No result yet" not in last


def test_it_shows_the_first_turns_of_a_very_long_conversation_and_says_so(people):
    run = agent_run([{"calls": [["lookup_order", {"order": f"o-{i}"}] for i in range(45)]}] * 10,
                    final="Finally done.")
    assert run.status == RunStatus.COMPLETED
    html = section(text(client_for(people["viewer"]).get(run_url(run))))
    assert sorted(turns_of(html)) == list(range(1, 10))  # 400 entries: 46 a turn, the 9th cut short
    assert "Showing the first turns only; the history below has every entry." in html
    assert "Finally done." not in html
    assert len(html.encode()) < live.PUSH_MAX_BYTES  # still pushed live
