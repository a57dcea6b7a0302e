"""Filters and search on the ambiguous-effects queue (connector, workflow, tenant, age, business-key
substring, run-id prefix), through paging, actions and tenant limits; bad values are a 400 that
says what is wrong. And the runs list's search by business-key substring."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import pytest
from django.urls import reverse

from operators.models import TenantScope
from sagas import start, workflow
from tests.console.conftest import client_for
from tests.console.queue_data import make_effect, make_run, resolve, text

pytestmark = pytest.mark.django_db

EFFECT_ANCHOR = re.compile(r'<tr id="effect-(\d+)"')
RUN_LINK = re.compile(r'<a class="mono" href="/runs/([0-9a-f-]{36})/"')


@workflow("bc_search", version=1)
def bc_search(ctx, data):  # pragma: no cover - never run: the tests only start runs
    return data


def listed(response) -> list[int]:
    assert response.status_code == 200, text(response)[:3000]
    return [int(i) for i in EFFECT_ANCHOR.findall(text(response))]


@pytest.fixture
def queue():
    """Effects on runs of two workflows and tenants, two connectors, different ages and keys."""
    ord_run = make_run(name="bc_orders", business_key="ORD-000123", tenant="acme")
    pay_run = make_run(name="bc_refunds", business_key="pay-77-0012", tenant="globex")
    other = make_run(name="bc_orders", business_key="ORD-999", tenant="acme")
    return {
        "ord": make_effect(run=ord_run, tenant="acme", connector="qp.blind", step="capture",
                           age=timedelta(minutes=2)),
        "pay": make_effect(run=pay_run, tenant="globex", connector="qp.lookup", step="refund",
                           age=timedelta(hours=2)),
        "old": make_effect(run=other, tenant="acme", connector="qp.lookup", step="ship", age=timedelta(days=3)),
    }


def test_it_filters_the_queue_by_connector_workflow_tenant_and_age(people, queue):
    client = client_for(people["viewer"])
    effects = reverse("console:effects")
    ids = {k: e.id for k, e in queue.items()}

    assert listed(client.get(effects)) == [ids["old"], ids["pay"], ids["ord"]]
    assert listed(client.get(effects, {"connector": "qp.lookup"})) == [ids["old"], ids["pay"]]
    assert listed(client.get(effects, {"workflow": "bc_orders"})) == [ids["old"], ids["ord"]]
    assert listed(client.get(effects, {"tenant": "globex"})) == [ids["pay"]]
    assert listed(client.get(effects, {"age": "5m"})) == [ids["old"], ids["pay"]]
    assert listed(client.get(effects, {"age": "1h"})) == [ids["old"], ids["pay"]]
    assert listed(client.get(effects, {"age": "1d"})) == [ids["old"]]
    assert listed(client.get(effects, {"connector": "qp.lookup", "workflow": "bc_orders"})) == [ids["old"]]
    assert listed(client.get(effects, {"tenant": "acme", "age": "1h", "connector": "qp.blind"})) == []

    page = text(client.get(effects, {"connector": "qp.lookup", "age": "1h"}))
    assert "<strong>2</strong> effects waiting" in page  # the count is of what matches
    assert '<option value="1h" selected>' in page and 'value="qp.lookup"' in page


def test_it_searches_the_queue_by_business_key_substring_and_run_id_prefix(people, queue):
    client = client_for(people["viewer"])
    effects = reverse("console:effects")
    ids = {k: e.id for k, e in queue.items()}
    run_id = str(queue["pay"].run_id)

    assert listed(client.get(effects, {"q": "0012"})) == [ids["pay"], ids["ord"]]  # inside the key, not a prefix
    assert listed(client.get(effects, {"q": "ord-000"})) == [ids["ord"]]  # any case
    assert listed(client.get(effects, {"q": "77-0"})) == [ids["pay"]]
    assert listed(client.get(effects, {"q": run_id})) == [ids["pay"]]
    assert listed(client.get(effects, {"q": run_id[:8]})) == [ids["pay"]]
    assert listed(client.get(effects, {"q": "%"})) == []  # LIKE wildcards are literal
    assert listed(client.get(effects, {"q": "ORD_"})) == []
    assert listed(client.get(effects, {"q": "0012", "tenant": "acme"})) == [ids["ord"]]


def test_it_finds_runs_by_a_business_key_substring_on_the_runs_list(people):
    first = start("bc_search", {"n": 1}, business_key="ORD-00012345")
    second = start("bc_search", {"n": 2}, business_key="order-77-0012")
    third = start("bc_search", {"n": 3}, business_key="ORD-999")
    client = client_for(people["viewer"])

    def runs(q: str) -> list[str]:
        response = client.get(reverse("console:runs"), {"q": q})
        assert response.status_code == 200
        return RUN_LINK.findall(text(response))

    assert runs("0012") == [str(second.id), str(first.id)]
    assert runs("ord-0001") == [str(first.id)]
    assert runs(str(first.id)[:8]) == [str(first.id)]
    assert runs("x%") == []
    # One or two characters have no piece to look up: they match the start of keys (an index range), as
    # a substring search for a rare one would read the whole table; ignoring case, like a substring.
    assert runs("OR") == [str(third.id), str(second.id), str(first.id)]
    assert runs("rd") == []  # inside "ORD-…", not at its start


def test_a_term_ending_in_a_star_finds_the_keys_that_start_with_it(people):
    kyc = start("bc_search", {"n": 1}, business_key="KYC-00010001")
    lower = start("bc_search", {"n": 2}, business_key="kyc-0001-retry")
    inside = start("bc_search", {"n": 3}, business_key="RE-KYC-00010002")
    start("bc_search", {"n": 4}, business_key="KYC-00020001")
    client = client_for(people["viewer"])

    def runs(q: str) -> list[str]:
        response = client.get(reverse("console:runs"), {"q": q})
        assert response.status_code == 200, text(response)
        return RUN_LINK.findall(text(response))

    assert runs("KYC-0001*") == [str(lower.id), str(kyc.id)]  # the start of the key, any case
    assert runs("kyc-0001**") == [str(lower.id), str(kyc.id)]
    assert runs("KYC-0001") == [str(inside.id), str(lower.id), str(kyc.id)]  # without the star: anywhere
    assert runs("KYC-00010001*") == [str(kyc.id)]
    assert runs("%*") == [] and runs("KYC_*") == []  # LIKE wildcards stay literal
    assert runs(str(kyc.id)[:6] + "*") == [str(kyc.id)]  # a run id's first digits, starred

    response = client.get(reverse("console:runs"), {"q": "**"})
    assert response.status_code == 400
    assert "type the start of a key before it" in text(response) and RUN_LINK.findall(text(response)) == []


def test_the_queue_s_search_takes_a_starred_key_start_too(people, queue):
    client = client_for(people["viewer"])
    effects = reverse("console:effects")
    ids = {k: e.id for k, e in queue.items()}
    assert listed(client.get(effects, {"q": "ord-000*"})) == [ids["ord"]]
    assert listed(client.get(effects, {"q": "0012*"})) == []  # inside keys, not at their start
    response = client.get(effects, {"q": "*"})
    assert response.status_code == 400 and "type the start of a key before it" in text(response)


def test_it_keeps_the_filters_on_every_page_of_the_queue(people):
    run = make_run(name="bc_orders", business_key="ORD-1")
    matching = [make_effect(run=run, connector="qp.lookup", step=f"s{i}", age=timedelta(minutes=60 + i))
                for i in range(53)]
    for i in range(5):
        make_effect(run=run, connector="qp.blind", step=f"other{i}", age=timedelta(minutes=60 + i))
    client = client_for(people["viewer"])

    first = client.get(reverse("console:effects"), {"connector": "qp.lookup", "q": "ord-1"})
    assert len(listed(first)) == 50
    next_link = re.search(r'href="([^"]+)" rel="next"', text(first)).group(1).replace("&amp;", "&")
    query = parse_qs(urlparse(next_link).query)
    assert query["connector"] == ["qp.lookup"] and query["q"] == ["ord-1"] and query["after"]
    second = client.get(next_link)
    assert set(listed(first)) | set(listed(second)) == {e.id for e in matching}
    assert not set(listed(first)) & set(listed(second))
    assert 'rel="next"' not in text(second)


def test_it_answers_400_with_the_problem_for_a_bad_filter_and_lists_nothing(people, queue):
    client = client_for(people["viewer"])
    effects = reverse("console:effects")
    cases = {
        "age": ("forever", "Unknown for: “forever” is not one of 5m, 1h, 1d, 7d"),
        "connector": ("qp\x00lookup", "Connector contains a NUL character"),
        "q": ("x" * 201, "Search is longer than 200 characters"),
        "tenant": ("t" * 101, "Tenant is longer than 100 characters"),
        "workflow": ("w\x00", "Workflow contains a NUL character"),
    }
    for name, (value, message) in cases.items():
        response = client.get(effects, {name: value})
        assert response.status_code == 400, name
        assert message in text(response), (name, text(response)[:2000])
        assert EFFECT_ANCHOR.findall(text(response)) == [], name


def test_it_narrows_within_the_users_tenants_only(people, queue):
    limited = people["operator"]
    TenantScope.objects.create(user=limited, tenants=["acme"])
    client = client_for(limited)
    effects = reverse("console:effects")
    assert listed(client.get(effects, {"tenant": "globex"})) == []
    assert listed(client.get(effects, {"q": "pay-77"})) == []
    assert listed(client.get(effects, {"q": str(queue["pay"].run_id)})) == []
    assert set(listed(client.get(effects))) == {queue["ord"].id, queue["old"].id}


def test_it_comes_back_to_the_filtered_queue_after_an_action(people, queue):
    client = client_for(people["operator"])
    page = text(client.get(reverse("console:effects"), {"connector": "qp.lookup", "age": "1h"}))
    carried = re.search(r'name="filters" value="([^"]*)"', page).group(1).replace("&amp;", "&")
    assert parse_qs(carried) == {"connector": ["qp.lookup"], "age": ["1h"]}

    response = resolve(client, queue["pay"], filters=carried)
    assert response.status_code == 302
    back = urlparse(response["Location"])
    assert back.path == reverse("console:effects")
    assert parse_qs(back.query) == {"connector": ["qp.lookup"], "age": ["1h"]}
    assert listed(client.get(response["Location"])) == [queue["old"].id]


def test_it_subscribes_the_live_region_with_the_pages_filters(people, queue):
    page = text(client_for(people["viewer"]).get(reverse("console:effects"), {"tenant": "globex", "q": "77"}))
    query = parse_qs(re.search(r'ws-connect="/ws/live/\?([^"]*)"', page).group(1).replace("&amp;", "&"))
    assert query["fragments"] == ["effects_queue"] and query["tenant"] == ["globex"] and query["q"] == ["77"]


CONNECTOR_OPTION = re.compile(r'<option value="(qp\.[a-z_.]+)"')


def test_it_offers_the_connectors_of_the_open_effects_the_user_sees_and_no_other(people, queue):
    from django.utils import timezone

    from ledger.models import EffectStatus
    from sagas.models import RunStatus

    effects = reverse("console:effects")
    # Not offered: a settled effect's connector, and one whose only effect is IN_PROGRESS under
    # a worker's live lease (that worker settles it; the queue does not list it).
    make_effect(connector="qp.settled", status=EffectStatus.SUCCEEDED)
    leased = make_run(status=RunStatus.RUNNING, lease_owner="w1",
                      lease_expires_at=timezone.now() + timedelta(minutes=5))
    make_effect(run=leased, connector="qp.leased", status=EffectStatus.IN_PROGRESS)
    # Offered: an IN_PROGRESS effect whose run no worker holds (stuck).
    make_effect(connector="qp.stuck", status=EffectStatus.IN_PROGRESS)

    def offered(user) -> list[str]:
        return CONNECTOR_OPTION.findall(text(client_for(user).get(effects)))

    assert offered(people["viewer"]) == ["qp.blind", "qp.lookup", "qp.stuck"]
    # A user of tenant globex alone: qp.blind's open effects are all acme's.
    TenantScope.objects.create(user=people["operator"], tenants=["globex"])
    assert offered(people["operator"]) == ["qp.lookup"]


def test_only_the_connector_walk_reads_the_open_connectors_index(people, queue):
    """effect_open_connector (ledger migration 0005) serves the walk for the filter's choices and
    nothing else: as a plain partial index the planner read it for the queue's count and its
    connector filter too, and then fetched every match to sort a page (12 ms against 0.05 ms at
    10M runs). With sequential scans off, each query shows which index it would take."""
    import json

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from operators.selectors.queues import EffectFilters, effect_connectors, effects_ambiguous

    user = people["viewer"]

    def indexes(sql: str) -> set[str]:
        with connection.cursor() as cur:
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("EXPLAIN (FORMAT JSON) " + sql)
            plan = json.dumps(cur.fetchone()[0])
        return set(re.findall(r'"Index Name": "([a-z_]+)"', plan))

    with CaptureQueriesContext(connection) as walk:
        assert effect_connectors(user=user) == ["qp.blind", "qp.lookup"]
    [walk_sql] = [q["sql"] for q in walk.captured_queries if "WITH RECURSIVE" in q["sql"]]
    assert "effect_open_connector" in indexes(walk_sql)

    filtered = effects_ambiguous(user=user, filters=EffectFilters(connector="qp.lookup", older_than=timedelta(hours=1)))
    with CaptureQueriesContext(connection) as queue_queries:
        assert filtered.count() == 2
        assert len(list(filtered[:51])) == 2
    for query in (q for q in queue_queries.captured_queries if "ledger_effectrecord" in q["sql"]):
        assert "effect_open_connector" not in indexes(query["sql"]), query["sql"]


@pytest.mark.parametrize("filters", [
    {}, {"workflow": "bc_orders", "tenant": "acme"}, {"connector": "qp.lookup", "older_than": timedelta(hours=1)},
])
def test_a_queue_page_reads_its_positions_from_the_open_effects_index_alone(people, queue, filters):
    """The queue's page reads the positions of its effects, ``(intent_at, id)``, with an index-only
    scan of effect_open_context, whose included columns every filter but the search tests, then
    its rows by primary key. Asking for whole rows at once let PostgreSQL, guessing that a
    workflow + tenant filter matches 13 of 20,000 open effects (315 did, at 10M runs), fetch
    every open effect's row and sort them (12.6 ms against 0.9). With sequential and bitmap scans
    off, the plan shows whether the page could be read from the index alone."""
    import json

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from operators.selectors.queues import EffectFilters, effects_ambiguous_page

    expected = {e.id for e in queue.values()
                if (not filters.get("tenant") or e.tenant == filters["tenant"])
                and (not filters.get("connector") or e.connector == filters["connector"])
                and (not filters.get("older_than") or e.id != queue["ord"].id)
                and (not filters.get("workflow") or e.id != queue["pay"].id)}
    with CaptureQueriesContext(connection) as queries:
        page = effects_ambiguous_page(user=people["viewer"], filters=EffectFilters(**filters))
    assert {row.effect.id for row in page.items} == expected and page.total == len(expected)
    [positions] = [q["sql"] for q in queries.captured_queries  # a page of 50, and one more to know of a next page
                   if "ledger_effectrecord" in q["sql"] and q["sql"].endswith("LIMIT 51")]
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_bitmapscan = off")
        cur.execute("EXPLAIN (FORMAT JSON) " + positions)
        plan = cur.fetchone()[0]
    scans = re.findall(r'"Node Type": "([A-Za-z ]+)", [^{}]*?"Relation Name": "ledger_effectrecord"', json.dumps(plan))
    assert scans == ["Index Only Scan"], (scans, positions)
