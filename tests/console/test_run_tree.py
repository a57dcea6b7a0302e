"""Issue 35: the run page shows a run's tree (its parent; its children, counted by status, the
oldest listed), and the runs list shows top-level runs only or one run's children. Rows made
with the ORM for the pages' cases, and a real tree made by a real worker."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console import live
from operators.selectors.runs import RUN_CHILDREN_SHOWN, RUNS_PAGE_SIZE, RunFilters, runs_page
from sagas import cancel, start
from sagas.models import ArchivedRun, CompensationItem, CompensationPlan, RunStatus, WorkflowRun
from tests.console.conftest import client_for
from tests.console.queue_data import make_run
from tests.console.run_data import IMG, IMG_ESCAPED, RUN_LINK, SCRIPT, SCRIPT_ESCAPED, run_url, text
from tests.procs import wait_until

pytestmark = pytest.mark.django_db

CHILD_STATUSES = [RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.RUNNING, RunStatus.FAILED,
                  RunStatus.NEEDS_ATTENTION, RunStatus.WAITING]


def tree(children: int = 6, **parent_fields) -> tuple[WorkflowRun, list[WorkflowRun]]:
    """A WAITING parent and ``children`` children in CHILD_STATUSES' order (repeated), started a
    millisecond apart, oldest first."""
    parent = make_run(status=RunStatus.WAITING, reason="", name="rt_parent", business_key=f"p-{uuid.uuid4()}",
                      **parent_fields)
    base = timezone.now() - timedelta(minutes=5)
    kids = []
    for i in range(children):
        kid = make_run(status=CHILD_STATUSES[i % len(CHILD_STATUSES)], reason="", name="rt_child",
                       business_key=f"kid-{i}@{str(parent.id)[:8]}", parent_run=parent.id, started_via="parent",
                       started_at=base + timedelta(milliseconds=i))
        kids.append(kid)
    # Created in that order too (auto_now_add wrote the insert time): the page lists by it.
    for i, kid in enumerate(kids):
        WorkflowRun.objects.filter(id=kid.id).update(created_at=base + timedelta(milliseconds=i))
    return parent, kids


def listed(response) -> list[str]:
    """Run ids in the runs table's rows, in page order (not the parent's link above them)."""
    assert response.status_code == 200
    body = re.search(r"<tbody>.*?</tbody>", text(response), re.S)
    return RUN_LINK.findall(body.group(0)) if body else []


def children_section(html: str) -> str:
    found = re.search(r'<section id="live-run_children".*?</section>', html, re.S)
    assert found, "no children section"
    return found.group(0)


def counts(section: str) -> dict[str, int]:
    """The section's counts by status (``<badge>STATUS</badge> n``)."""
    return {status: int(n) for status, n in re.findall(r'<span class="badge (\w+)">\1</span> (\d+)</a>', section)}


# --- the parent's page -----------------------------------------------------------------------------


def test_a_parents_page_counts_its_children_by_status_and_links_the_oldest_first(people):
    parent, kids = tree(6)
    html = text(client_for(people["viewer"]).get(run_url(parent)))
    section = children_section(html)
    assert counts(section) == {"RUNNING": 1, "WAITING": 1, "NEEDS_ATTENTION": 1, "COMPLETED": 2, "FAILED": 1}
    assert "6 in all" in section
    assert RUN_LINK.findall(section) == [str(k.id) for k in kids]  # oldest first, each linked
    assert 'class="badge NEEDS_ATTENTION">NEEDS_ATTENTION</span>' in section and "kid-5" in section
    # Each count links to the runs list filtered by the parent (and that status); so does "show all".
    assert f'href="/runs/?parent={parent.id}&amp;status=FAILED"' in section
    assert f'<a href="/runs/?parent={parent.id}">Show all 6 in the runs list</a>' in section
    # A run with no children shows no section (an empty, hidden region) and no parent line.
    alone = make_run(status=RunStatus.COMPLETED, reason="")
    html = text(client_for(people["viewer"]).get(run_url(alone)))
    assert re.search(r'<section id="live-run_children"[^>]*hidden></section>', html) and "Parent run" not in html


def test_a_large_fan_out_is_counted_in_one_query_and_lists_only_the_first_ones(people):
    client = client_for(people["viewer"])

    def queries_for(children: int) -> tuple[int, str]:
        parent, _ = tree(children)
        with CaptureQueriesContext(connection) as queries:
            response = client.get(run_url(parent))
        assert response.status_code == 200
        tree_queries = [q["sql"] for q in queries if '"parent_run" = ' in q["sql"]]
        # One GROUP BY for the counts, one bounded read for the table: never a read of them all.
        assert len(tree_queries) == 2, tree_queries
        assert any("GROUP BY" in q for q in tree_queries)
        assert all("GROUP BY" in q or f"LIMIT {RUN_CHILDREN_SHOWN}" in q for q in tree_queries), tree_queries
        return len(queries), children_section(text(response))

    few, _ = queries_for(3)
    many, section = queries_for(RUN_CHILDREN_SHOWN + 70)
    assert few == many, f"{few} queries with 3 children, {many} with {RUN_CHILDREN_SHOWN + 70}"
    assert len(RUN_LINK.findall(section)) == RUN_CHILDREN_SHOWN
    assert f"Showing the first {RUN_CHILDREN_SHOWN} of {RUN_CHILDREN_SHOWN + 70}." in section
    assert f"Show all {RUN_CHILDREN_SHOWN + 70} in the runs list" in section
    assert sum(counts(section).values()) == RUN_CHILDREN_SHOWN + 70


def test_the_tree_reads_go_through_the_children_index(people):
    parent, _ = tree(3)
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        with CaptureQueriesContext(connection) as queries:
            client_for(people["viewer"]).get(run_url(parent))
        tree_queries = [q["sql"] for q in queries if '"parent_run" = ' in q["sql"]]
        assert len(tree_queries) == 2
        for sql in tree_queries:
            cur.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert "run_children" in plan and "Seq Scan" not in plan, (sql, plan)


def test_a_childs_page_links_to_its_parent_and_says_when_it_is_detached(people):
    parent, kids = tree(2)
    WorkflowRun.objects.filter(id=kids[1].id).update(detached=True)
    client = client_for(people["viewer"])
    html = text(client.get(run_url(kids[0])))
    assert re.search(rf'<dt>Parent run</dt><dd><a class="mono" href="/runs/{parent.id}/" rel="up">{parent.id}</a>',
                     html)
    assert "rt_parent" in html and "detached" not in html
    assert "detached" in text(client.get(run_url(kids[1])))
    # The parent's page says which child is detached.
    rows = children_section(text(client.get(run_url(parent))))
    assert rows.count('<span class="muted">detached</span>') == 1


def test_a_child_whose_parent_was_archived_says_so(people):
    parent, kids = tree(1)
    ArchivedRun.objects.create(
        run_id=parent.id, workflow_name=parent.workflow_name, version=1, tenant=parent.tenant,
        status=RunStatus.COMPLETED, created_at=parent.created_at, archived_at=timezone.now(),
        location="file:///nowhere/archive.jsonl.gz", offset=0, length=1, batch=uuid.uuid4())
    WorkflowRun.objects.filter(id=parent.id).delete()  # retention deleted its row
    html = text(client_for(people["viewer"]).get(run_url(kids[0])))
    assert re.search(rf'parent <a class="mono" href="/runs/{parent.id}/" rel="up">{parent.id}</a> \(archived\)', html)
    # Gone without an archive row (no page to open): said, not linked.
    orphan = make_run(status=RunStatus.RUNNING, reason="", parent_run=uuid.uuid4())
    html = text(client_for(people["viewer"]).get(run_url(orphan)))
    assert re.search(rf'parent <span class="mono">{orphan.parent_run}</span> \(archived\)', html)


def test_a_parent_outside_the_users_tenants_is_not_shown(people):
    from operators.models import TenantScope

    parent = make_run(status=RunStatus.WAITING, reason="", tenant="globex", name="secret_parent")
    kid = make_run(status=RunStatus.RUNNING, reason="", tenant="acme", parent_run=parent.id)
    make_run(status=RunStatus.RUNNING, reason="", tenant="globex", parent_run=parent.id)
    TenantScope.objects.create(user=people["viewer"], tenants=["acme"])
    html = text(client_for(people["viewer"]).get(run_url(kid)))
    assert "secret_parent" not in html and f'href="/runs/{parent.id}/"' not in html


def test_it_escapes_hostile_business_keys_and_workflow_names_of_children(people):
    parent = make_run(status=RunStatus.WAITING, reason="")
    make_run(status=RunStatus.RUNNING, reason="", parent_run=parent.id, business_key=IMG, name=SCRIPT[:200])
    client = client_for(people["viewer"])
    section = children_section(text(client.get(run_url(parent))))
    assert IMG_ESCAPED in section and SCRIPT_ESCAPED in section
    assert IMG not in section and SCRIPT not in section
    pushed = live.render_fragment("run_children", people["viewer"], {"run": str(parent.id)})
    assert IMG_ESCAPED in pushed and IMG not in pushed and SCRIPT not in pushed


def test_the_children_region_is_live_on_a_parents_page(people):
    parent, kids = tree(2)
    user = people["viewer"]
    html = live.render_fragment("run_children", user, {"run": str(parent.id)})
    assert re.match(r'\s*<section id="live-run_children"', html) and counts(html) == {"COMPLETED": 2}
    WorkflowRun.objects.filter(id=kids[1].id).update(status=RunStatus.FAILED)
    assert counts(live.render_fragment("run_children", user, {"run": str(parent.id)})) == {
        "COMPLETED": 1, "FAILED": 1}
    assert "live-run_children" in live.render_fragment("run_children", user, {"run": "nonsense"})
    # It follows the page's run and every run (a child moves without its parent).
    assert set(live.topics_for("run_children", {"run": str(parent.id)})) == {f"run.{parent.id}", "runs"}
    client = client_for(user)

    def subscribed(run) -> str:
        page = text(client.get(run_url(run)))
        return re.search(r'ws-connect="/ws/live/\?([^"]+)"', page).group(1).replace("&amp;", "&")

    assert "run_children" in subscribed(parent)  # it has children
    assert "run_children" in subscribed(make_run(status=RunStatus.RUNNING, reason=""))  # it may start some
    assert "run_children" not in subscribed(make_run(status=RunStatus.COMPLETED, reason=""))  # it never will


# --- the runs list -------------------------------------------------------------------------------


def test_the_runs_list_shows_top_level_runs_only_or_the_children_of_one_run(people):
    parent, kids = tree(3)
    other, other_kids = tree(2)
    loner = make_run(status=RunStatus.COMPLETED, reason="")
    client = client_for(people["viewer"])
    runs = reverse("console:runs")

    everything = set(listed(client.get(runs)))
    assert everything == {str(r.id) for r in (parent, other, loner, *kids, *other_kids)}
    assert set(listed(client.get(runs, {"top_level": "1"}))) == {str(parent.id), str(other.id), str(loner.id)}
    page = client.get(runs, {"parent": str(parent.id)})
    assert listed(page) == [str(k.id) for k in reversed(kids)]  # newest first, as the list always is
    assert f'Child runs of run <a class="mono" href="/runs/{parent.id}/">{parent.id}</a>' in text(page)
    # The id as pasted (no dashes, upper case, spaces around it) is the same run.
    assert set(listed(client.get(runs, {"parent": f" {parent.id.hex.upper()} "}))) == {str(k.id) for k in kids}
    # With the other filters, and kept in the form.
    assert listed(client.get(runs, {"parent": str(parent.id), "status": "RUNNING"})) == [str(kids[2].id)]
    assert listed(client.get(runs, {"parent": str(parent.id), "status": "COMPLETED"})) == [
        str(kids[1].id), str(kids[0].id)]
    page = text(client.get(runs, {"top_level": "1", "status": "COMPLETED"}))
    assert re.search(r'<input type="checkbox" name="top_level" value="1" checked', page)
    assert RUN_LINK.findall(page) == [str(loner.id)]
    page = text(client.get(runs, {"parent": str(parent.id)}))
    assert f'name="parent" value="{parent.id}"' in page
    # A parent with no children, or no such run: nothing listed, no error.
    assert listed(client.get(runs, {"parent": str(loner.id)})) == []
    assert listed(client.get(runs, {"parent": str(uuid.uuid4())})) == []


def test_the_next_page_link_keeps_the_tree_filters(people):
    parent, kids = tree(RUNS_PAGE_SIZE + 3)
    make_run(status=RunStatus.COMPLETED, reason="")  # top-level, the newest run of all
    client = client_for(people["viewer"])
    first = client.get(reverse("console:runs"), {"parent": str(parent.id)})
    next_url = re.search(r'<a href="([^"]+)" rel="next">', text(first)).group(1).replace("&amp;", "&")
    assert f"parent={parent.id}" in next_url
    second = client.get(next_url)
    assert listed(first) + listed(second) == [str(k.id) for k in reversed(kids)]
    first = client.get(reverse("console:runs"), {"top_level": "1"})
    assert len(listed(first)) == 2 and 'rel="next"' not in text(first)


@pytest.mark.parametrize(
    ("params", "message", "field"),
    [
        ({"parent": "not-a-run"}, "Parent run: “not-a-run” is not a run id", "parent"),
        ({"parent": "1234"}, "is not a run id", "parent"),
        ({"parent": "x" * 61}, "Parent run is longer than 60 characters", "parent"),
        ({"parent": "<img src=x onerror=alert(1)>"}, "is not a run id", "parent"),
        ({"top_level": "maybe"}, "Top-level runs only: “maybe” is not understood", "top_level"),
        ({"top_level": "1", "parent": str(uuid.UUID(int=7))}, "cannot go together", "top_level"),
    ],
)
def test_a_bad_tree_filter_is_a_form_error_not_a_500(people, params, message, field):
    parent, _ = tree(1)
    response = client_for(people["viewer"]).get(reverse("console:runs"), params)
    assert response.status_code == 400  # as every other malformed filter of the list
    html = text(response)
    assert message in html and RUN_LINK.findall(html) == []
    assert "<img src=x" not in html  # what was typed is shown escaped
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', html), field


def test_the_tree_filters_page_through_an_index(people):
    """Top-level runs are a range of their own partial index, a parent's children one of the
    children index: never a walk past the other kind (EXPLAIN, sequential scans disallowed)."""
    parent, _ = tree(2)
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        for filters, index in ((RunFilters(top_level=True), "run_top_level"),
                               (RunFilters(parent=str(parent.id)), "run_children")):
            with CaptureQueriesContext(connection) as queries:
                runs_page(filters, user=people["viewer"])
            cur.execute("EXPLAIN " + queries[-1]["sql"])
            plan = "\n".join(row[0] for row in cur.fetchall())
            assert index in plan and "Seq Scan" not in plan, (filters, plan)


# --- compensation items that are child runs ------------------------------------------------------


def test_a_compensation_plan_with_child_run_items_shows_them_as_links(people):
    parent, kids = tree(2)
    plan = CompensationPlan.objects.create(run=parent, reason="customer cancelled", trigger="operator",
                                           created_at=timezone.now())
    CompensationItem.objects.create(plan=plan, position=0, child_run=kids[1].id, step_name="child:rt_child",
                                    connector="", compensation_key="")
    html = text(client_for(people["viewer"]).get(run_url(parent)))
    section = re.search(r'<section id="live-run_compensation".*?</section>', html, re.S).group(0)
    assert f'child run <a class="mono" href="/runs/{kids[1].id}/">{str(kids[1].id)[:8]}</a>' in section
    assert "undone by its own compensation" in section


# --- a real tree, made by a real worker ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_real_tree_from_a_worker_on_the_parent_and_child_pages_the_list_and_the_compensation(
        people, procs, providers_url):
    from tests.sagas import wf_children  # noqa: F401  (registers the workflows in this process)

    parent = start("waiting_tree", {"n": 3, "detached": True}, business_key="tree-1")
    loner = start("waiting_tree", {"n": 0}, business_key="tree-0")
    procs.worker("w1", "tests.sagas.wf_children", DEMO_PROVIDERS_URL=providers_url)
    wait_until(lambda: WorkflowRun.objects.filter(parent_run=parent.id, status=RunStatus.WAITING).count() == 4, 60,
               what="four children waiting for their signal")
    wait_until(lambda: WorkflowRun.objects.get(id=parent.id).status == RunStatus.WAITING, 30,
               what="the parent waiting for its children")
    wait_until(lambda: WorkflowRun.objects.get(id=loner.id).status == RunStatus.COMPLETED, 30,
               what="the tree of none to complete")
    kids = list(WorkflowRun.objects.filter(parent_run=parent.id).order_by("created_at"))
    client = client_for(people["viewer"])

    section = children_section(text(client.get(run_url(parent))))
    assert counts(section) == {"WAITING": 4} and "4 in all" in section
    assert RUN_LINK.findall(section) == [str(k.id) for k in kids]
    assert section.count("waiting_child") == 4 and section.count('<span class="muted">detached</span>') == 1
    for kid in kids:
        html = text(client.get(run_url(kid)))
        assert f'href="/runs/{parent.id}/" rel="up">{parent.id}</a>' in html
        assert ("run-detached" in html) == kid.detached
        assert "via <bdi>parent</bdi>" in html

    runs = reverse("console:runs")
    assert set(listed(client.get(runs, {"top_level": "1"}))) == {str(parent.id), str(loner.id)}
    assert set(listed(client.get(runs, {"parent": str(parent.id)}))) == {str(k.id) for k in kids}

    # The compensation preview lists the attached children as items of their own (no effect).
    operator = client_for(people["operator"])
    preview = text(operator.get(run_url(parent, "console:run_compensate")))
    attached = [k for k in kids if not k.detached]
    for kid in attached:
        assert f'child run <a class="mono" href="/runs/{kid.id}/">{str(kid.id)[:8]}</a>' in preview
    assert f'href="/runs/{next(k for k in kids if k.detached).id}/"' not in preview
    assert "3 child runs, each by its own compensation" in preview

    # Cancelled with compensation: the plan on the parent's page shows the children it undid.
    cancel(run_id=parent.id, reason="customer cancelled the order", compensate=True)
    wait_until(lambda: WorkflowRun.objects.get(id=parent.id).status == RunStatus.COMPENSATED, 60,
               what="the parent to be compensated")
    html = text(client.get(run_url(parent)))
    plan = re.search(r'<section id="live-run_compensation".*?</section>', html, re.S).group(0)
    for kid in attached:
        assert f'href="/runs/{kid.id}/"' in plan
    assert counts(children_section(html)) == {"WAITING": 1, "COMPENSATED": 3}
