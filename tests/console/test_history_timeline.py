"""A run's history as a timeline: one compact row per journal entry (time to the millisecond
with its zone, the time since the entry before, the worker that wrote it), payloads folded to
their preview, a filter by kind, a jump to a seq, and effects, compensations and approvals
paired with their outcomes."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.models import EffectStatus
from sagas.models import ApprovalRequest, ApprovalState, RunStatus
from tests.console.conftest import client_for
from tests.console.history_data import T0, journal
from tests.console.queue_data import make_effect, make_run
from tests.console.run_data import IMG, IMG_ESCAPED, SCRIPT, SCRIPT_ESCAPED, append_entries, text, waiting_run

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<li class="entry kind-([a-z_]+)" id="seq-(\d+)"(?: data-pair="(\w+)")?>(.*?)</li>', re.S)


def history(client, run, **params) -> tuple[object, str]:
    response = client.get(reverse("console:run_history", args=[run.id]), params)
    return response, text(response)


def rows(page: str) -> dict[int, tuple[str, str | None, str]]:
    """seq -> (kind, pair role, the row's markup)."""
    return {int(seq): (kind, pair, body) for kind, seq, pair, body in ROW.findall(page)}


def pair_cell(body: str) -> str:
    found = re.search(r'<span class="entry-pair">(.*?)</span>\s*(?:<details|<span class="entry-payload)', body, re.S)
    return found.group(1) if found else ""


def cell(body: str, css: str) -> str:
    found = re.search(rf'<(?:span|bdi|time)[^>]*class="{css}[^"]*"[^>]*>(.*?)</(?:span|bdi|time)>', body, re.S)
    return found.group(1).strip() if found else ""


def test_it_shows_the_time_to_the_millisecond_with_its_zone_the_gap_and_the_worker(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    journal(
        run,
        ("started", "", {"input": 1}, "", T0),
        ("claimed", "", {"fence": 1}, "worker-7@host-a", T0 + timedelta(microseconds=50_500)),
        ("step", "fetch", {"value": 2}, "worker-7@host-a", T0 + timedelta(minutes=3, seconds=4, microseconds=50_500)),
    )
    response, page = history(client_for(people["viewer"]), run)
    assert response.status_code == 200
    shown = rows(page)
    assert [kind for kind, _, _ in shown.values()] == ["step", "claimed", "started"]  # newest first

    started, claimed, step = shown[1][2], shown[2][2], shown[3][2]
    assert re.search(r"<time [^>]*>23:59:58\.345 UTC</time>", started)  # not .345678
    assert re.search(r"<time [^>]*>23:59:58\.396 UTC</time>", claimed)
    assert re.search(r'title="Wednesday 4 March 2026, 23:59:58\.345 UTC"', started)  # the date on hover
    assert cell(claimed, "entry-gap") == "+50 ms" and cell(step, "entry-gap") == "+3 min 4 s"
    assert cell(started, "entry-gap") == ""  # nothing before the first entry
    # The date above the first row of each day.
    days = re.findall(r'<li class="day"><time datetime="([0-9-]+)">([^<]+)</time></li>\s*<li [^>]*id="seq-(\d+)"', page)
    assert days == [("2026-03-05", "Thursday 5 March 2026", "3"), ("2026-03-04", "Wednesday 4 March 2026", "2")]
    assert cell(step, "entry-worker") == "worker-7@host-a" and cell(step, "entry-name") == "fetch"


def test_it_filters_by_kind_and_answers_a_bad_kind_with_a_400(people):
    run = waiting_run()
    client = client_for(people["viewer"])
    _response, page = history(client, run, kind="effect_intent")
    assert {kind for kind, _, _ in rows(page).values()} == {"effect_intent"} and len(rows(page)) == 2
    _response, page = history(client, run, kind="effects")
    assert {kind for kind, _, _ in rows(page).values()} == {"effect_intent", "effect_result"}
    assert '<option value="effects" selected>' in page

    response, page = history(client, run, kind=IMG)
    assert response.status_code == 400
    assert "not a kind of journal entry" in page and IMG not in page and not rows(page)
    response = client.get(reverse("console:run_history", args=[run.id]), {"kind": "nope"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400


def test_it_jumps_to_the_page_holding_an_entry_with_its_anchor(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    append_entries(run, 250)  # seqs 1..250: pages 250..151, 150..51, 50..1
    client = client_for(people["viewer"])
    url = reverse("console:run_history", args=[run.id])

    response = client.get(url, {"seq": "120"})
    assert response.status_code == 302 and response["Location"] == f"{url}?before=151#seq-120"
    with CaptureQueriesContext(connection) as queries:
        page = text(client.get(f"{url}?before=151"))
    # The page, the newer link, and (the run is RUNNING: its holder's newest steps may not be
    # counted in last_seq yet, sagas.store.numbering) one index lookup of its newest entry.
    journal_reads = [q["sql"] for q in queries if 'FROM "sagas_journalentry"' in q["sql"]]
    assert len(journal_reads) == 3 and sum('MAX("sagas_journalentry"."seq")' in q for q in journal_reads) == 1
    assert sorted(rows(page)) == list(range(51, 151)) and 'id="seq-120"' in page
    assert f'href="{url}?before=51"' in page  # older
    assert f'href="{url}"' in page and "Newest entries" in page  # and back up
    assert client.get(url, {"seq": "250"})["Location"] == f"{url}#seq-250"  # the first page
    assert client.get(url, {"seq": "1"})["Location"] == f"{url}?before=51#seq-1"

    for bad in ("251", "0", "x", "99999999999999999999999"):
        response = client.get(url, {"seq": bad})
        assert response.status_code == 400, bad
        assert "Go to entry" in text(response)


def test_it_pairs_each_effect_intent_with_its_outcome(people):
    run = waiting_run()  # charge and ship SUCCEEDED, an approval pending
    client = client_for(people["viewer"])
    _response, page = history(client, run)
    shown = rows(page)
    intents = {re.search(r'class="entry-name">(.*?)<', body).group(1): seq
               for seq, (kind, _, body) in shown.items() if kind == "effect_intent"}
    results = {re.search(r'class="entry-name">(.*?)<', body).group(1): seq
               for seq, (kind, _, body) in shown.items() if kind == "effect_result"}
    for name in ("charge", "ship"):
        intent, result = intents[name], results[name]
        assert shown[intent][1] == "intent" and shown[result][1] == "outcome"
        pair = pair_cell(shown[intent][2])
        assert f'href="#seq-{result}"' in pair and '<span class="badge SUCCEEDED">SUCCEEDED</span>' in pair
        assert re.search(r"after \d+(\.\d)? (ms|s)", pair)
        back = pair_cell(shown[result][2])
        assert f'href="#seq-{intent}"' in back and re.search(r"SUCCEEDED</span> <span class=\"muted\">after \d+", back)
    requested = next(seq for seq, (kind, _, _) in shown.items() if kind == "approval_requested")
    assert shown[requested][1] == "intent" and "no outcome yet" in pair_cell(shown[requested][2])
    assert '<span class="badge PENDING">PENDING</span>' in pair_cell(shown[requested][2])
    # No decision in the journal: the request's own state (a cancelled run's expires, unjournaled).
    ApprovalRequest.objects.filter(run=run).update(state=ApprovalState.EXPIRED)
    _response, page = history(client, run)
    assert '<span class="badge EXPIRED">EXPIRED</span>' in pair_cell(rows(page)[requested][2])

    # Filtered to intents, the outcome is on another page: the link jumps to it.
    _response, page = history(client, run, kind="effect_intent")
    pair = pair_cell(rows(page)[intents["charge"]][2])
    assert f'href="/runs/{run.id}/history/?seq={results["charge"]}"' in pair

    # An intent whose outcome is not known yet shows the ledger's status.
    at = run.updated_at
    journal(run, ("effect_intent", "refund", {"connector": "rp.charge"}, "w:1", at),
            ("compensation_intent", "charge", {"connector": "rp.charge"}, "w:1", at + timedelta(seconds=1)),
            ("compensation_result", "charge", {"status": "FAILED_FINAL"}, "w:2", at + timedelta(seconds=3)))
    make_effect(run=run, step="refund", status=EffectStatus.UNKNOWN)
    _response, page = history(client, run)
    shown = rows(page)
    last = run.last_seq
    assert '<span class="badge UNKNOWN">UNKNOWN</span>' in pair_cell(shown[last - 2][2])
    assert shown[last - 1][1] == "intent" and "FAILED_FINAL" in pair_cell(shown[last - 1][2])
    assert "after 2.0 s" in pair_cell(shown[last - 1][2])
    assert f'href="#seq-{last - 1}"' in pair_cell(shown[last][2])


def test_it_folds_payloads_to_their_preview(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    journal(run, ("step", "big", {"rows": ["r%05d" % i for i in range(3000)], "api_key": "sk_live_42"}, "w", T0))
    client = client_for(people["viewer"])
    _response, page = history(client, run)
    body = rows(page)[1][2]
    assert '<details class="entry-payload">' in body  # folded (no "open")
    assert "r00010" in body and "r02999" not in page and "sk_live_42" not in page  # the preview only
    more = reverse("console:run_item_payload", args=[run.id, "entry", 1])
    assert f'hx-get="{more}"' in body
    whole = text(client.get(more))
    assert "r02999" in whole and "sk_live_42" not in whole


def test_it_escapes_hostile_names_workers_and_payloads(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    journal(run, ("step", SCRIPT, {"note": IMG}, IMG, T0), ("effect_intent", SCRIPT, {}, "w", T0),
            ("effect_result", SCRIPT, {"status": SCRIPT}, "w", T0))
    _response, page = history(client_for(people["viewer"]), run)
    assert SCRIPT not in page and IMG not in page
    assert f'<bdi class="entry-name">{SCRIPT_ESCAPED}</bdi>' in page
    assert f'<bdi class="entry-worker mono" title="{IMG_ESCAPED}">{IMG_ESCAPED}</bdi>' in page


def test_it_pairs_an_approval_with_its_decision_hundreds_of_entries_later(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    journal(run, ("approval_requested", "ship", {"reason": "ship it?"}, "w:1", T0),
            ("approval_expired", "ship", {"approved": False, "expired": True, "on_timeout": "escalate"}, "sweeper",
             T0 + timedelta(hours=4)))
    append_entries(run, 700)
    journal(run, ("approval_decided", "ship", {"approved": True, "by": "ann"}, "ann", T0 + timedelta(hours=5)))
    client = client_for(people["viewer"])
    url = reverse("console:run_history", args=[run.id])

    _response, page = history(client, run)  # the newest 100: the decision, far from its request
    decided = pair_cell(rows(page)[703][2])
    assert f'href="{url}?seq=1"' in decided and "APPROVED" in decided and "after 5 h 0 min" in decided
    page = text(client.get(client.get(url, {"seq": "1"})["Location"]))
    requested = pair_cell(rows(page)[1][2])  # escalated first, then approved: the last word counts
    assert f'href="{url}?seq=703"' in requested and "APPROVED" in requested and "ESCALATED" not in requested
    assert "ESCALATED" in pair_cell(rows(page)[2][2])


def test_a_running_runs_page_counts_the_steps_its_worker_journaled_since_the_last_renewal(people):
    """A step writes only its journal entry; the run's row catches up at the next renewal. The
    page must not lag behind its own history meanwhile: the count, the timeline and the jump."""
    run = make_run(status=RunStatus.RUNNING, reason="")
    append_entries(run, 10)
    with connection.cursor() as cur:  # the holder's newest steps, not yet counted into the row
        cur.execute("""INSERT INTO sagas_journalentry (run_id, seq, kind, name, payload, worker_id, created_at)
                       SELECT %s, %s + n, 'step', 'fresh#' || n, '{}', 'w:1', now() FROM generate_series(1, 3) AS n""",
                    [run.id, run.last_seq])
    newest = run.last_seq + 3
    client = client_for(people["viewer"])
    detail = text(client.get(reverse("console:run", args=[run.id])))
    assert f"{newest} entries" in detail
    url = reverse("console:run_history", args=[run.id])
    response, page = history(client, run)
    assert f"{newest} entries, newest first" in page and max(rows(page)) == newest
    assert client.get(url, {"seq": str(newest)}).status_code == 302  # the jump finds the newest entry
    response = client.get(url, {"seq": str(newest + 1)})
    assert response.status_code == 400 and f"its entries are #1 to #{newest}" in text(response)
