"""Child runs: a parent starts children and waits for them holding no worker; a crash never
starts two; a child's failure compensates the tree newest first; cancelling a parent stops its
children. Real worker processes, real kills, real PostgreSQL and Redis, the demo providers."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from demo.models import ProviderExecution
from sagas import cancel, replay_check, signal, start
from sagas.models import CompensationItem, JournalEntry, RunStatus, WorkflowRun
from tests.procs import wait_until
from tests.sagas import wf_children  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_children"


def children_of(parent) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_run=parent.id).order_by("created_at"))


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def books() -> Counter:
    return Counter(ProviderExecution.objects.values_list("provider", "operation"))


def worker(procs, providers_url, name, **env):
    return procs.worker(name, MODULES, DEMO_PROVIDERS_URL=providers_url, **env)


def test_a_parent_fans_out_and_gathers_its_children_without_holding_a_worker(procs, step_calls):
    parent = start("fan_out", {"n": 20, "label": "F", "pause": 0.05})
    worker_ = procs.worker("w1", MODULES)
    wait_until(lambda: status(parent) == RunStatus.COMPLETED, 60, what="the parent to gather its children")

    parent.refresh_from_db()
    assert parent.result == {"children": 20, "sum": sum(2 * i for i in range(20))}
    kids = children_of(parent)
    assert len(kids) == 20 and {k.status for k in kids} == {RunStatus.COMPLETED}
    assert {k.started_via for k in kids} == {"parent"} and {k.tenant for k in kids} == {parent.tenant}
    # Each child's id comes from the parent and the call: the same call always names the same child.
    calls = ["child:fan_child"] + [f"child:fan_child#{n}" for n in range(2, 21)]
    assert {str(k.id) for k in kids} == {str(uuid.uuid5(parent.id, c)) for c in calls}
    assert step_calls.counts("F") == {f"child{i}": 1 for i in range(20)}
    # The parent waited as WAITING (no worker held): its journal says so, and a replay agrees.
    kinds = list(JournalEntry.objects.filter(run=parent).values_list("kind", flat=True))
    assert kinds.count("child_started") == 20 and kinds.count("child_finished") == 20
    assert "suspended" in kinds and kinds.count("children_joined") == 1
    # Woken once its last child ended, not once per child: a claim to fan out, one to finish.
    assert parent.attempts <= 3, parent.attempts
    assert replay_check("fan_out", runs=[parent.id]).ok
    assert "Traceback" not in worker_.log()


def test_a_parent_killed_while_starting_100_children_starts_exactly_100(procs, step_calls):
    parent = start("fan_out_paced", {"n": 100, "label": "K"})
    first = procs.worker("w1", MODULES)
    wait_until(lambda: WorkflowRun.objects.filter(parent_run=parent.id).count() >= 30, 60,
               what="the parent to be a third of the way through its fan-out")
    first.kill()  # SIGKILL, mid-fan-out
    killed_at = WorkflowRun.objects.filter(parent_run=parent.id).count()
    assert 30 <= killed_at < 100
    # A second death exactly between a child's insert and the commit, then one just after it.
    procs.worker("w2", MODULES, SAGAS_CRASH_AT="child_start_uncommitted:child:fan_child#70")
    wait_until(lambda: "crash point child_start_uncommitted" in procs.procs[-1].log()
               or procs.procs[-1].popen.poll() is not None, 90, what="the crash before the 70th commit")
    procs.worker("w3", MODULES, SAGAS_CRASH_AT="after_child_start:child:fan_child#85")
    wait_until(lambda: procs.procs[-1].popen.poll() is not None, 90, what="the crash after the 85th commit")
    procs.worker("w4", MODULES)
    wait_until(lambda: status(parent) == RunStatus.COMPLETED, 120, what="the parent to finish")

    kids = children_of(parent)
    assert len(kids) == 100 and {k.status for k in kids} == {RunStatus.COMPLETED}
    assert len(JournalEntry.objects.filter(run=parent, kind="child_started")) == 100
    assert step_calls.counts("K") == {f"child{i}": 1 for i in range(100)}
    parent.refresh_from_db()
    assert parent.result == {"children": 100, "sum": sum(2 * i for i in range(100))}


def test_a_child_failing_compensates_the_finished_children_newest_first_each_once(procs, providers_url):
    parent = start("order_tree", {"id": "T-1", "amount_cents": 4200, "parcels": ["a", "b", "c"], "fail_last": True})
    worker(procs, providers_url, "w1")
    worker(procs, providers_url, "w2")
    wait_until(lambda: status(parent) in (RunStatus.COMPENSATED, RunStatus.NEEDS_ATTENTION, RunStatus.FAILED), 90,
               what="the parent to compensate its tree")

    parent.refresh_from_db()
    assert parent.status == RunStatus.COMPENSATED
    failed = JournalEntry.objects.get(run=parent, kind="failed").payload
    assert failed["type"] == "ChildFailed" and "the carrier refused the last parcel" in failed["message"]
    kids = children_of(parent)
    assert [(k.workflow_name, k.status) for k in kids] == [
        ("parcel", RunStatus.COMPENSATED), ("parcel", RunStatus.COMPENSATED), ("parcel", RunStatus.COMPENSATED),
        ("parcel_check", RunStatus.FAILED),
    ]
    # The provider's books: each reservation released once, the capture refunded once.
    assert books() == Counter({("payments", "capture"): 1, ("payments", "refund"): 1,
                               ("inventory", "reserve"): 3, ("inventory", "release"): 3})
    # Newest first: parcel c, then b, then a, then the parent's own capture.
    undone = list(ProviderExecution.objects.filter(operation__in=["release", "refund"]).order_by("id")
                  .values_list("operation", "request"))
    reserved = dict(ProviderExecution.objects.filter(operation="reserve")
                    .values_list("response__reservation_id", "request__sku"))
    assert [reserved.get(req.get("reservation_id"), op) for op, req in undone] == ["c", "b", "a", "refund"]
    items = CompensationItem.objects.filter(plan__run=parent).order_by("position")
    assert [(i.step_name, i.state) for i in items] == [
        ("child:parcel", "SUCCEEDED"), ("child:parcel", "SUCCEEDED"), ("child:parcel", "SUCCEEDED"),
        ("capture", "SUCCEEDED"),
    ]


def test_a_childs_error_reaches_the_parent_that_catches_it(procs):
    parent = start("catching_parent", {})
    procs.worker("w1", MODULES)
    wait_until(lambda: status(parent) == RunStatus.COMPLETED, 60, what="the parent to catch its child's failure")
    parent.refresh_from_db()
    caught = parent.result["caught"]
    assert caught["code"] == "child_failed" and caught["status"] == RunStatus.FAILED
    assert "the carrier refused the last parcel" in caught["child_error"]["message"]
    assert caught["child_run_id"] == str(children_of(parent)[0].id)


def test_cancelling_a_parent_stops_and_undoes_its_running_children_but_not_a_detached_one(procs, providers_url):
    parent = start("waiting_tree", {"n": 3, "detached": True})
    worker(procs, providers_url, "w1")
    wait_until(lambda: WorkflowRun.objects.filter(parent_run=parent.id, status=RunStatus.WAITING).count() == 4, 60,
               what="four children waiting for their signal")
    wait_until(lambda: status(parent) == RunStatus.WAITING, 30, what="the parent waiting for its children")

    cancel(run_id=parent.id, reason="customer cancelled the order", compensate=True)
    wait_until(lambda: status(parent) == RunStatus.COMPENSATED, 60, what="the parent to be compensated")

    kids = children_of(parent)
    attached = [k for k in kids if not k.detached]
    assert [k.status for k in attached] == [RunStatus.COMPENSATED] * 3
    free = next(k for k in kids if k.detached)
    assert free.status == RunStatus.WAITING  # detached: it outlives its parent
    assert books() == Counter({("inventory", "reserve"): 5, ("inventory", "release"): 4})
    undone = JournalEntry.objects.get(run=attached[0], kind="compensation_started").payload
    assert undone["trigger"] == "parent"
    assert undone["reason"] == f"its parent run {parent.id} is compensating: cancelled: customer cancelled the order"
    # The detached child still takes an operator's signal and completes on its own.
    signal(run_id=free.id, name="go", payload={"from": "operator"})
    wait_until(lambda: status(free) == RunStatus.COMPLETED, 30, what="the detached child to complete")


def test_cancelling_a_parent_without_compensation_cancels_its_children_the_same_way(procs, providers_url):
    parent = start("waiting_tree", {"n": 2})
    worker(procs, providers_url, "w1")
    wait_until(lambda: WorkflowRun.objects.filter(parent_run=parent.id, status=RunStatus.WAITING).count() == 2, 60,
               what="two children waiting")
    cancel(run_id=parent.id, reason="stop", compensate=False)
    assert status(parent) == RunStatus.CANCELLED
    assert [k.status for k in children_of(parent)] == [RunStatus.CANCELLED] * 2
    assert books() == Counter({("inventory", "reserve"): 3})


def test_a_parent_signals_its_children_and_an_operator_can_signal_a_child(procs, providers_url):
    by_parent = start("waiting_tree", {"n": 2, "signal": True})
    by_operator = start("waiting_tree", {"n": 1})
    worker(procs, providers_url, "w1")
    wait_until(lambda: status(by_parent) == RunStatus.COMPLETED, 60, what="the signalled tree to complete")
    by_parent.refresh_from_db()
    assert by_parent.result == {"got": [{"signal": {"from": "parent"}}] * 2}

    wait_until(lambda: WorkflowRun.objects.filter(parent_run=by_operator.id, status=RunStatus.WAITING).exists(), 60,
               what="the child waiting")
    signal(run_id=children_of(by_operator)[0].id, name="go", payload={"from": "operator"})
    wait_until(lambda: status(by_operator) == RunStatus.COMPLETED, 60, what="the tree to complete")
    by_operator.refresh_from_db()
    assert by_operator.result == {"got": [{"signal": {"from": "operator"}}]}


def test_the_parents_budget_covers_its_children(procs, step_calls):
    parent = start("budget_parent", {"children": 4, "cost": 0.4, "label": "B"}, max_cost=1.0)
    procs.worker("w1", MODULES)
    wait_until(lambda: status(parent) == RunStatus.NEEDS_ATTENTION, 60, what="the budget to stop the parent")
    parent.refresh_from_db()
    assert parent.status_reason == "budget_exceeded" and parent.error["budget"] == "cost"
    assert float(parent.cost_used) == pytest.approx(1.2)
    kids = children_of(parent)
    # Each child got what the parent had left when it started; the 4th was never started.
    assert [float(k.max_cost) for k in kids] == pytest.approx([1.0, 0.6, 0.2])
    assert step_calls.counts("B") == {"spend0": 1, "spend1": 1, "spend2": 1}


def test_retention_keeps_a_child_while_its_parent_is_in_flight_then_archives_the_tree(step_calls, tmp_path, settings):
    from datetime import timedelta

    from django.utils import timezone

    from sagas.models import ArchivedRun
    from sagas.replay.engine import advance
    from sagas.retention.archiving import archive_due

    settings.SAGAS_ARCHIVE_URL = (tmp_path / "archive").as_uri()
    parent = start("fan_out", {"n": 2, "label": "R"})
    advance(str(parent.id), owner="t")
    assert status(parent) == RunStatus.WAITING
    kids = children_of(parent)
    for kid in kids:
        advance(str(kid.id), owner="t")
    assert [status(k) for k in kids] == [RunStatus.COMPLETED] * 2
    long_ago = timezone.now() - timedelta(days=400)
    WorkflowRun.objects.filter(parent_run=parent.id).update(finished_at=long_ago)

    archive_due()  # the parent waits for them: it may still compensate them
    assert WorkflowRun.objects.filter(parent_run=parent.id).count() == 2

    advance(str(parent.id), owner="t")
    assert status(parent) == RunStatus.COMPLETED
    WorkflowRun.objects.filter(id=parent.id).update(finished_at=long_ago)
    archive_due()
    assert not WorkflowRun.objects.filter(id__in=[parent.id, *[k.id for k in kids]]).exists()
    assert ArchivedRun.objects.filter(run_id__in=[parent.id, *[k.id for k in kids]]).count() == 3


def test_a_child_under_a_taken_business_key_or_a_gather_of_junk_fails_the_parent_with_a_clear_error(step_calls):
    from sagas.replay.engine import advance

    other = start("fan_child", {"i": 9, "label": "X"}, business_key="parcel-7")
    parent = start("keyed_parent", {"key": "parcel-7"})
    advance(str(parent.id), owner="t")
    parent.refresh_from_db()
    assert parent.status == RunStatus.FAILED
    assert "business key 'parcel-7' already exists" in parent.error["message"]
    assert list(WorkflowRun.objects.filter(parent_run=parent.id)) == []  # nothing half-started
    assert not JournalEntry.objects.filter(run=parent, kind="child_started").exists()
    assert status(other) == RunStatus.PENDING

    junk = start("bad_gather", {})
    advance(str(junk.id), owner="t")
    junk.refresh_from_db()
    assert junk.status == RunStatus.FAILED
    assert "takes handles returned by ctx.start_child, not str" in junk.error["message"]


def test_a_childs_end_lost_to_a_crash_is_reported_by_the_sweeper(procs, step_calls):
    from sagas.runtime.recovery import sweep

    parent = start("fan_out", {"n": 1, "label": "S"})
    crashed = procs.worker("w1", MODULES, SAGAS_CRASH_AT="before_tree_report:fan_child")
    wait_until(lambda: crashed.popen.poll() is not None, 60, what="the worker to die after the child completed")
    kid = children_of(parent)[0]
    assert (kid.status, status(parent)) == (RunStatus.COMPLETED, RunStatus.WAITING)
    assert not JournalEntry.objects.filter(run=parent, kind="child_finished").exists()

    # Once the child's end is older than the sweeper's grace, the sweeper reports it.
    wait_until(lambda: sweep().children == 1, 30, interval=0.5, what="the sweeper to report the child's end")
    assert JournalEntry.objects.get(run=parent, kind="child_finished").payload["result"] == 0  # child 0: 0 * 2
    procs.worker("w2", MODULES)
    wait_until(lambda: status(parent) == RunStatus.COMPLETED, 60, what="the parent to complete")
    assert sweep().children == 0


def test_a_parent_that_ends_cancels_its_attached_children_and_leaves_detached_ones(procs, providers_url):
    parent = start("returns_early", {})
    worker(procs, providers_url, "w1")
    wait_until(lambda: status(parent) == RunStatus.COMPLETED, 60, what="the parent to return")
    wait_until(lambda: WorkflowRun.objects.filter(parent_run=parent.id, detached=True,
                                                  status=RunStatus.WAITING).exists(), 60,
               what="the detached child to wait for its signal")
    attached = WorkflowRun.objects.get(parent_run=parent.id, detached=False)
    wait_until(lambda: status(attached) == RunStatus.CANCELLED, 30, what="the attached child to be cancelled")
    attached.refresh_from_db()
    assert attached.error["message"].endswith(f"its parent run {parent.id} ended COMPLETED")


def test_a_parent_that_died_before_closing_its_children_has_them_cancelled_by_the_sweeper(procs, providers_url):
    from sagas.runtime.recovery import sweep

    parent = start("returns_early", {})
    crashed = worker(procs, providers_url, "w1", SAGAS_CRASH_AT="before_tree_report:returns_early")
    wait_until(lambda: crashed.popen.poll() is not None, 60, what="the worker to die after the parent returned")
    assert status(parent) == RunStatus.COMPLETED
    attached = WorkflowRun.objects.get(parent_run=parent.id, detached=False)
    assert attached.status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)

    wait_until(lambda: sweep().children == 1, 30, interval=0.5, what="the sweeper to close the parent's children")
    assert status(attached) == RunStatus.CANCELLED
    free = WorkflowRun.objects.get(parent_run=parent.id, detached=True)
    assert free.status != RunStatus.CANCELLED


def test_a_child_that_continues_as_new_stays_its_parents_child_and_a_re_run_reuses_earlier_children(step_calls):
    from django.contrib.auth import get_user_model

    from sagas import fork
    from sagas.replay.engine import advance

    def drive(*runs) -> None:
        """Advance every PENDING run of the trees until nothing moves (one process, no worker)."""
        for _ in range(20):
            pending = list(WorkflowRun.objects.filter(status=RunStatus.PENDING).values_list("id", flat=True))
            if not pending:
                return
            for run_id in pending:
                advance(str(run_id), owner="t")

    parent = start("two_children", {"label": "C"})
    drive()
    parent.refresh_from_db()
    assert parent.status == RunStatus.COMPLETED
    assert parent.result == {"first": "end of chain", "second": 10}
    chain = children_of(parent)
    # The chain's two runs and the second child are all the parent's children.
    assert sorted(k.workflow_name for k in chain) == ["chain_child", "chain_child", "fan_child"]
    second_of_chain = next(k for k in chain if k.continued_from is not None)
    finished = JournalEntry.objects.get(run=parent, kind="child_finished", name="child:chain_child").payload
    assert finished["run_id"] == str(second_of_chain.id) and finished["result"] == "end of chain"

    middle = JournalEntry.objects.get(run=parent, kind="step", name="middle").seq
    ann = get_user_model().objects.create(username="ann")
    rerun = fork(run_id=parent.id, at_seq=middle, reason="re-run from the middle", user=ann)
    drive()
    rerun.refresh_from_db()
    assert rerun.status == RunStatus.COMPLETED and rerun.result == {"first": "end of chain", "second": 10}
    # The chain child was reused (never started again); the re-run started its own second child.
    assert WorkflowRun.objects.filter(workflow_name="chain_child").count() == 2
    assert [k.workflow_name for k in children_of(rerun)] == ["fan_child"]
    assert step_calls.counts("C") == {"middle": 2, "child5": 2}
