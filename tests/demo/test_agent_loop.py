"""The demo's stock watcher (``demo/agent_loop.py``): a pydantic-ai agent loop that continues as
new every 200 turns, on a real worker process."""

from __future__ import annotations

import pytest

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def chain_of(first_id) -> list[WorkflowRun]:
    runs, next_id = [], first_id
    while next_id is not None:
        runs.append(WorkflowRun.objects.get(id=next_id))
        next_id = runs[-1].continued_to
    return runs


def test_the_stock_watcher_continues_as_new_every_200_turns_and_carries_its_counts_and_cost(procs):
    first = start("stock_watch", {"store": "leeds", "turns": 450}, business_key="watch-leeds")
    procs.worker("w1", "")  # demo.apps registers the watcher in every process
    wait_until(lambda: chain_of(first.id)[-1].status == RunStatus.COMPLETED
               and chain_of(first.id)[-1].status_reason == "", 120, what="the watcher to finish 450 turns")

    runs = chain_of(first.id)
    assert len(runs) == 3
    model_turns = [JournalEntry.objects.filter(run=r, kind="step", name__startswith="watch.model").count()
                   for r in runs]
    assert model_turns == [200, 200, 50]  # no run journals more than 200 turns
    assert [r.business_key for r in runs] == ["watch-leeds", "watch-leeds#2", "watch-leeds#3"]
    assert [r.input.get("turn", 0) for r in runs] == [0, 200, 400]
    result = runs[-1].result
    # Levels (turn * 37 + 11) % 100 below 20 over turns 0-449: the counts crossed two continuations.
    expected = sum((t * 37 + 11) % 100 < 20 for t in range(450))
    assert result == {"store": "leeds", "turns": 450, "reorders": expected, "last": result["last"]}
    assert result["last"].split()[0] in ("ok", "reorder")
    # The cost budget is the chain's: each run starts from what the runs before it used.
    costs = [r.cost_used for r in runs]
    assert 0 < costs[0] < costs[1] < costs[2] and all(r.max_cost == runs[0].max_cost for r in runs)
