"""The inbox and the overview show an open approval exactly while its run waits for the
decision (WAITING or NEEDS_ATTENTION). They read a flag kept on the approval by triggers
(``sagas.store.approval_waits``) instead of joining every open approval to its run, so these
tests move runs through their statuses the ways the engine and operators do and check what an
approver sees after each move."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.urls import reverse

from operators.selectors.queues import approvals_inbox, approvals_open
from sagas.models import ApprovalRequest, RunStatus, WorkflowRun
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_run

pytestmark = pytest.mark.django_db


def inbox_ids(client) -> list[int]:
    html = client.get(reverse("console:approvals")).content.decode()
    return [int(i) for i in re.findall(r'<tr id="approval-(\d+)" data-action-row', html)]


def overview_count(client) -> str:
    html = client.get(reverse("console:overview")).content.decode()
    found = re.search(r'id="queue-approvals">.*?<td class="num">(\d+)</td>', html, re.S)
    return found.group(1) if found else html


def set_status(run: WorkflowRun, status: str) -> None:
    WorkflowRun.objects.filter(id=run.id).update(status=status)  # as the engine does: one UPDATE


def test_an_approval_shows_while_its_run_waits_and_not_while_a_worker_holds_the_run(people):
    run = make_run(status=RunStatus.RUNNING, reason="")
    approval = make_approval(run=run)  # the worker asks while it holds the run
    approver = client_for(people["approver"])
    assert inbox_ids(approver) == []
    set_status(run, RunStatus.WAITING)  # then parks it
    assert inbox_ids(approver) == [approval.id]
    set_status(run, RunStatus.RUNNING)  # a signal woke it: a worker holds it again
    assert inbox_ids(approver) == []
    set_status(run, RunStatus.NEEDS_ATTENTION)  # parked for a person (an unknown effect)
    assert inbox_ids(approver) == [approval.id]
    set_status(run, RunStatus.COMPLETED)  # it went on without the decision
    assert inbox_ids(approver) == []
    assert approvals_open(user=people["approver"]).count() == 0


def test_a_stale_save_of_an_approval_cannot_put_it_back_in_the_inbox(people):
    run = make_run(status=RunStatus.WAITING, reason="")
    stale = make_approval(run=run)
    stale.refresh_from_db()
    assert stale.run_waits
    set_status(run, RunStatus.RUNNING)
    stale.comment = "saved from an object loaded while the run still waited"
    stale.save()  # writes every column, run_waits=True among them
    assert not ApprovalRequest.objects.get(id=stale.id).run_waits
    assert approvals_inbox(user=people["approver"]).items == []


def test_the_overview_and_the_inbox_count_the_same_waiting_approvals(people):
    waiting = [make_approval(run=make_run(status=RunStatus.WAITING, reason=""), step=f"s{i}") for i in range(3)]
    held = make_approval(run=make_run(status=RunStatus.RUNNING, reason=""), step="held")
    approver = client_for(people["approver"])
    assert overview_count(approver) == "3"
    assert sorted(inbox_ids(approver)) == sorted(a.id for a in waiting)
    set_status(held.run, RunStatus.WAITING)
    assert overview_count(approver) == "4"
    assert approvals_inbox(user=people["approver"]).total == 4


def test_the_inbox_reads_the_waiting_approvals_index_without_joining_runs(people):
    for i in range(5):
        make_approval(run=make_run(status=RunStatus.WAITING, reason=""), step=f"s{i}")
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        sql, params = approvals_open(user=people["approver"]).values("id").order_by().query.sql_with_params()
        cur.execute(f"EXPLAIN SELECT count(*) FROM ({sql}) AS q", params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "approval_waiting_deadline" in plan, plan
