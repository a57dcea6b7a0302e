"""Priority: with more runs waiting than a worker has threads, the worker takes the runs of the
highest priority (1) first, whatever the order they were started in."""

from __future__ import annotations

import pytest

from sagas import start
from sagas.errors import InvalidArgument
from sagas.models import RunStatus, WorkflowRun
from sagas.versions import registry
from tests.procs import wait_until
from tests.sagas import wf_engine  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine"


def test_a_saturated_worker_takes_the_urgent_runs_before_the_backlog(procs, step_calls):
    backlog = [start("slow_steps", {"steps": 1, "pause": 0.05}, priority=5).id for _ in range(12)]
    middle = [start("slow_steps", {"steps": 1, "pause": 0.05}).id for _ in range(3)]
    urgent = [start("slow_steps", {"steps": 1, "pause": 0.05}, priority=1).id for _ in range(3)]
    procs.worker("w1", MODULES)  # one thread: it takes one run at a time, in the queues' order
    everything = backlog + middle + urgent
    wait_until(lambda: WorkflowRun.objects.filter(id__in=everything, status=RunStatus.COMPLETED).count() == 18,
               timeout=60, what="every run completed")
    order = list(WorkflowRun.objects.filter(id__in=everything).order_by("finished_at").values_list("id", flat=True))
    assert set(order[:3]) == set(urgent)
    assert set(order[3:6]) == set(middle)
    assert set(order[6:]) == set(backlog)


def test_a_run_takes_its_workflows_priority_unless_the_start_says_otherwise(step_calls):
    assert start("slow_steps", {"steps": 1}).priority == 3
    assert start("slow_steps", {"steps": 1}, priority=2).priority == 2
    for bad in (0, 6, "1", 1.5, True):
        with pytest.raises(InvalidArgument, match="priority must be a whole number from 1"):
            start("slow_steps", {"steps": 1}, priority=bad)
    assert WorkflowRun.objects.count() == 2
    with pytest.raises(ValueError, match="priority must be a whole number from 1"):
        registry.workflow("never", priority=9)
