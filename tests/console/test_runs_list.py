"""The runs list, driven with the Django test client against real PostgreSQL: access, filters,
search, keyset pages through an index, and escaping."""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from operators.models import AuditEntry, TenantScope
from operators.selectors.paging import decode_cursor, encode_cursor
from operators.selectors.runs import RunFilters, runs_page
from sagas import start
from sagas.models import (
    RunStatus,
    WorkflowRun,
)
from tests.console.conftest import client_for
from tests.console.run_data import (
    IMG,
    IMG_ESCAPED,
    RUN_LINK,
    SCRIPT,
    SCRIPT_ESCAPED,
    act,
    listed,
    parked_run,
    run_url,
    set_created,
    text,
)

pytestmark = pytest.mark.django_db


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


def test_it_filters_runs_by_status_workflow_version_tenant_and_creation_time(people):
    acme = start("rp_plain", {"n": 1}, business_key="k-acme", tenant="acme")
    globex = start("rp_plain", {"n": 2}, business_key="k-globex", tenant="globex")
    parked = parked_run()
    set_created(acme, datetime(2026, 1, 10, 12, 0, tzinfo=UTC))
    set_created(globex, datetime(2026, 1, 12, 8, 30, tzinfo=UTC))
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


def test_a_business_key_search_lists_every_key_holding_the_term_and_no_other_through_the_key_pieces_index(people):
    """The key-pieces index (every 3- and 4-character piece of each key, lower-cased) answers a
    term of 3 or 4 characters by itself and narrows a longer one, which lower(key) LIKE then tests: a key
    holding every 4-character piece of ``abcde`` in another order is not a match, case is
    ignored beyond ASCII, and LIKE's wildcards stay literal."""
    keys = ["abcd-xbcde", "xxABCDEyy", "Straße-ÄBC-9", "ORD-0012", "ord-00123", "ORD-1200", "50%_off", "ab"]
    made = {key: start("rp_plain", {}, business_key=key) for key in keys}
    viewer = people["viewer"]
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        for term in ("abcde", "ABC", "äbc", "ÄBC-9", "straße", "0012", "00123", "0%_o", "bcd-x", "xbcdea"):
            expected = {str(made[key].id) for key in keys if term.lower() in key.lower()}
            with CaptureQueriesContext(connection) as queries:
                found = {str(r.id) for r in runs_page(RunFilters(search=term), user=viewer).items}
            assert found == expected, term
            searched = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and "saga_key_grams" in q["sql"]]
            assert searched, (term, [q["sql"] for q in queries])
            cur.execute("EXPLAIN " + searched[-1])
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert "run_business_key_grams" in plan, (term, plan)
    # It holds both 4-character pieces of "abcde" (abcd, bcde) but not the term: tested, and left out.
    assert str(made["abcd-xbcde"].id) not in {str(r.id) for r in runs_page(RunFilters(search="abcde"),
                                                                           user=viewer).items}
    assert listed(client_for(viewer).get(reverse("console:runs"), {"q": "ÄbC"})) == [str(made["Straße-ÄBC-9"].id)]


def test_it_pages_through_runs_newest_first_with_a_cursor_and_no_repeats(people):
    runs = [start("rp_plain", {"n": i}) for i in range(120)]
    # Half of them share one creation time: the id breaks the tie, so no row is lost or repeated.
    same = datetime(2026, 2, 1, 9, 0, tzinfo=UTC)
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
    assert response.status_code == 400
    assert message in text(response) and RUN_LINK.findall(text(response)) == []


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
    now = datetime.now(UTC)
    F = RunFilters
    combinations = [
        F(), F(status="FAILED"), F(workflow="rp_plain"), F(workflow="rp_plain", version=1), F(tenant="acme"),
        F(created_from=now - timedelta(days=1), created_to=now), F(search=str(run.id)), F(search="order-"),
        F(search="ORDER-*"), F(search="or"),
        F(search=run.id.hex[:8]), F(status="FAILED", workflow="rp_plain", tenant="acme"),
        F(status="WAITING", created_from=now - timedelta(days=1)), F(tenant="acme", workflow="rp_plain", version=1),
    ]
    everyone = people["viewer"]
    limited = people["operator"]
    TenantScope.objects.create(user=limited, tenants=["acme"])  # adds "tenant IN (...)" to every filter
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        for filters, user, page_cursor in itertools.product(combinations, (everyone, limited), (None, cursor)):
            with CaptureQueriesContext(connection) as queries:
                runs_page(filters, user=user, cursor=page_cursor)
            cur.execute("EXPLAIN " + queries[-1]["sql"])
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert "Seq Scan" not in plan, (filters, user, plan)
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'sagas_workflowrun'")
        indexes = {row[0] for row in cur.fetchall()}
    assert {"run_created_keyset", "run_status_created", "run_workflow_created", "run_workflow_version_created",
            "run_tenant_created", "run_business_key_prefix", "run_business_key_upper_prefix"} <= indexes


def test_a_starred_search_reads_the_key_start_index(people):
    """``KYC-0001*`` is one range of the ``upper(business_key)`` b-tree, not the key-pieces index
    (whose lists for a key's common start grow with the table)."""
    start("rp_plain", {}, business_key="order-1")
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        for term in ("ORDER-*", "or"):
            with CaptureQueriesContext(connection) as queries:
                runs_page(RunFilters(search=term), user=people["viewer"])
            searched = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and "UPPER(" in q["sql"]]
            cur.execute("EXPLAIN " + searched[-1])
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert "run_business_key_upper_prefix" in plan and "run_business_key_grams" not in plan, (term, plan)


def test_it_escapes_hostile_business_keys_in_the_list(people):
    start("rp_plain", {}, business_key=IMG, tenant=SCRIPT[:100])
    page = text(client_for(people["viewer"]).get(reverse("console:runs")))
    assert IMG_ESCAPED in page and SCRIPT_ESCAPED in page
    assert IMG not in page and SCRIPT not in page


def test_a_search_matching_many_runs_walks_them_newest_first_and_lists_what_the_sorted_search_lists(people,
                                                                                                   monkeypatch):
    """A term PostgreSQL expects to match more than ``SORTED_MATCHES`` runs is tested on each run
    walked newest first (the created index, never the key-pieces index, which would read every
    match first), up to ``WALK_ROWS`` runs: same pages, same order, as the sorted search of a
    few matches, whether the walk fills a page or falls back."""
    from operators.selectors import runs as run_selectors

    made = [start("rp_plain", {}, business_key=f"ORD-{i:03d}-{'x' if i % 3 else 'hit'}") for i in range(12)]
    hits = [str(r.id) for r in reversed(made) if r.business_key.endswith("hit")]
    viewer = people["viewer"]

    def pages(size: int = 2) -> list[str]:
        seen, cursor = [], None
        while True:
            page = runs_page(RunFilters(search="-HIT"), user=viewer, cursor=cursor, size=size)
            seen += [str(r.id) for r in page.items]
            if page.next is None:
                return seen
            cursor = page.next

    assert pages() == hits  # few: found through the key-pieces index and sorted
    monkeypatch.setattr(run_selectors, "SORTED_MATCHES", -1)  # as if the table held millions of matches
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        with CaptureQueriesContext(connection) as queries:
            runs_page(RunFilters(search="-HIT"), user=viewer)
        cur.execute("EXPLAIN " + queries[-1]["sql"])
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "run_created_keyset" in plan and "run_business_key_grams" not in plan, plan
    assert pages() == hits
    # The estimate was wrong: a page is not filled within the runs the walk may read, so it is
    # found through the index and sorted after all; the pages are the same again.
    monkeypatch.setattr(run_selectors, "WALK_ROWS", 2)
    assert pages() == hits
    assert pages(size=1) == hits


@pytest.mark.parametrize("term", ["ORD-00*", "or"])
def test_a_key_start_expected_to_match_many_runs_walks_no_further_than_the_walk_allows(people, monkeypatch, term):
    """A key's start (``KYC-0001*``, or a term of one or two characters) is a range of the
    ``upper(business_key)`` b-tree, whose size PostgreSQL estimates from a histogram of 1 %
    buckets: at ten million runs, 1,250 matches among the oldest runs were estimated at 101,011,
    and left to itself PostgreSQL walked every run newest first to find them (1.8 s). Expected
    to match many, such a term is walked no further than ``WALK_ROWS`` runs, then found through
    its index and sorted: on a page with more than ``WALK_ROWS`` runs after it, every query that
    reads the runs in the list's order is bounded below by a creation time (or sorts what an index
    found), and the pages are the sorted search's."""
    from operators.selectors import runs as run_selectors

    base = datetime(2026, 3, 1, tzinfo=UTC)
    made = [start("rp_plain", {}, business_key=f"{'ORD-00' if i < 4 else 'PAY-10'}{i:02d}") for i in range(12)]
    for i, run in enumerate(made):
        set_created(run, base + timedelta(minutes=i))  # the matches are the oldest runs
    hits = [str(r.id) for r in reversed(made[:4])]
    monkeypatch.setattr(run_selectors, "SORTED_MATCHES", -1)  # estimated to match many
    monkeypatch.setattr(run_selectors, "WALK_ROWS", 3)  # fewer than the runs made after the matches
    seen, cursor = [], None
    while True:
        page = runs_page(RunFilters(search=term), user=people["viewer"], cursor=cursor, size=2)
        seen += [str(r.id) for r in page.items]
        if page.next is None:
            break
        cursor = page.next
    assert seen == hits
    with CaptureQueriesContext(connection) as queries:  # the first page: more than WALK_ROWS runs to walk
        assert [str(r.id) for r in runs_page(RunFilters(search=term), user=people["viewer"], size=2).items] == hits[:2]
    in_order = [q["sql"] for q in queries if 'ORDER BY "sagas_workflowrun"."created_at" DESC' in q["sql"]
                and "UPPER(" in q["sql"] and "LIMIT" in q["sql"]]
    assert in_order, [q["sql"] for q in queries]
    for sql in in_order:
        assert '"sagas_workflowrun"."created_at" >=' in sql, sql
