"""A run page shows the chain a ``ctx.continue_as_new`` loop makes: the run's place in it, links
to the first, previous, next and newest runs, and the chain's business key, escaped."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from console import live
from sagas import Context, start, workflow
from sagas.models import WorkflowRun
from sagas.replay.engine import Outcome, advance
from tests.console.conftest import client_for
from tests.console.run_data import SCRIPT, SCRIPT_ESCAPED, run_url, text

pytestmark = pytest.mark.django_db


def _turn(i: int) -> int:
    return i


@workflow("rc_loop", version=1)
def rc_loop(ctx: Context, state: dict) -> dict:
    i = state["i"]
    ctx.step("turn", _turn, i)
    if i + 1 >= state["end"]:
        return {"turns": i + 1}
    return ctx.continue_as_new({"i": i + 1, "end": state["end"]})


def chain(runs: int, business_key: str = "") -> list[WorkflowRun]:
    """A finished chain of ``runs`` runs, advanced in this process."""
    run = start("rc_loop", {"i": 0, "end": runs}, business_key=business_key)
    found = [run]
    for n in range(runs):
        outcome = advance(str(found[-1].id), owner="t")
        found[-1].refresh_from_db()
        if n < runs - 1:
            assert outcome == Outcome.COMPLETED and found[-1].continued_to is not None
            found.append(WorkflowRun.objects.get(id=found[-1].continued_to))
    assert found[-1].status == "COMPLETED" and found[-1].result == {"turns": runs}
    return found


def links(page: str) -> set[str]:
    return set(re.findall(r'href="(/runs/[0-9a-f-]{36}/)"', page))


def test_it_shows_a_middle_run_with_links_to_every_neighbour_and_the_key_escaped(people):
    first, middle, last = chain(3, business_key=SCRIPT)
    page = text(client_for(people["viewer"]).get(run_url(middle)))

    assert "Chain: run 2 of 3" in page
    assert {run_url(first), run_url(last)} <= links(page)
    assert f'href="{run_url(first)}" rel="prev"' in page and f'href="{run_url(last)}" rel="next"' in page
    assert SCRIPT_ESCAPED in page and SCRIPT not in page  # the chain's business key, shown escaped
    assert f"{SCRIPT_ESCAPED}#2" in page  # this run's own key
    assert "(the chain's start)" in page


def test_it_shows_the_first_run_with_its_next_and_newest_runs(people):
    first, second, _, newest = chain(4)
    page = text(client_for(people["viewer"]).get(run_url(first)))

    assert "Chain: run 1 of 4" in page and "this run" in page
    assert f'href="{run_url(second)}" rel="next"' in page and 'rel="prev"' not in page
    assert run_url(newest) in links(page)  # the newest run, three links away
    assert "continued_as_new" in page  # why it completed


def test_it_says_nothing_of_a_chain_on_a_run_that_is_in_none(people):
    run = start("rc_loop", {"i": 0, "end": 1})
    advance(str(run.id), owner="t")
    page = text(client_for(people["viewer"]).get(run_url(run)))
    assert "Chain:" not in page and "the chain" not in page


def test_the_live_header_and_the_runs_list_show_the_chain(people):
    first, last = chain(2)
    header = live.render_fragment("run_header", people["viewer"], {"run": str(last.id)})
    assert "Chain: run 2 of 2" in header and f'href="{run_url(first)}" rel="prev"' in header
    listing = text(client_for(people["viewer"]).get(reverse("console:runs") + "?workflow=rc_loop"))
    row = next(r for r in listing.split("<tr") if str(first.id) in r)
    assert "continued_as_new" in row  # the list says the first run continued rather than finished


def test_the_history_filter_for_the_runs_life_includes_where_it_continued_as_new(people):
    first, _last = chain(2)
    url = reverse("console:run_history", args=[first.id])
    page = text(client_for(people["viewer"]).get(url, {"kind": "run"}))
    assert "continued_as_new" in page  # the entry that ended this run and pointed at the next
    assert "claimed" in page
