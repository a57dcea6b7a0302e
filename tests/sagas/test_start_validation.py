"""``start()`` and the other entry points that store what callers give them refuse bad
arguments with a clear, typed error before touching the database (no query at all), where
they used to fail with DataError, RecursionError, IntegrityError or TypeError, or silently
return a run of another version."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

import ledger
from ledger.errors import InvalidResolution
from sagas import (
    InvalidArgument,
    NotSerializable,
    StartConflict,
    approve,
    cancel,
    compensate,
    reject,
    retry,
    signal,
    start,
    workflow,
)
from sagas.models import JournalEntry, WorkflowRun

pytestmark = pytest.mark.django_db


@workflow("sv_order", version=1)
def sv_order_v1(ctx, order: dict) -> dict:
    return order


@workflow("sv_order", version=2)
def sv_order_v2(ctx, order: dict) -> dict:
    return {"v2": order}


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def circular() -> list:
    value: list = []
    value.append(value)
    return value


REFUSED = [
    # (what, kwargs of start, error type, message fragment)
    ("NUL in an input string", {"input": {"note": "a\x00b"}}, NotSerializable,
     "the run's input contains a NUL character"),
    ("NUL in an input key", {"input": {"a\x00": 1}}, NotSerializable, "the run's input contains a NUL character"),
    ("NUL deep inside the input", {"input": {"items": [{"sku": ["x", "y\x00"]}]}}, NotSerializable,
     "contains a NUL character"),
    ("a lone surrogate", {"input": {"name": "\ud800"}}, NotSerializable, "contains a lone surrogate"),
    ("100,000 nested lists", {"input": nested(100_000)}, NotSerializable,
     "the run's input is nested deeper than 64 levels"),
    ("65 nested lists", {"input": nested(65)}, NotSerializable, "nested deeper than 64 levels"),
    ("a list that contains itself", {"input": circular()}, NotSerializable, "nested deeper than 64 levels"),
    ("a set", {"input": {"ids": {1, 2}}}, NotSerializable, "the run's input is not JSON"),
    ("NaN", {"input": {"total": math.nan}}, NotSerializable, "the run's input is not JSON"),
    ("an object", {"input": {"when": object()}}, NotSerializable, "the run's input is not JSON"),
    ("over 10 MiB", {"input": {"blob": "x" * (10 * 1024 * 1024)}}, NotSerializable,
     "the run's input is larger than 10 MiB as JSON"),
    ("NUL in the business key", {"business_key": "order\x00-1"}, InvalidArgument,
     "business_key contains a NUL character"),
    ("a newline in the business key", {"business_key": "order-1\n"}, InvalidArgument,
     "business_key contains a control character (U+000A)"),
    ("a business key of 201 characters", {"business_key": "k" * 201}, InvalidArgument,
     "business_key is longer than 200 characters (201)"),
    ("business_key=None", {"business_key": None}, InvalidArgument, "business_key must be a string, not NoneType"),
    ("NUL in the tenant", {"tenant": "ac\x00me"}, InvalidArgument, "tenant contains a NUL character"),
    ("a tenant of 101 characters", {"tenant": "t" * 101}, InvalidArgument,
     "tenant is longer than 100 characters (101)"),
    ("tenant=None", {"tenant": None}, InvalidArgument, "tenant must be a string, not NoneType"),
    ("an empty tenant", {"tenant": ""}, InvalidArgument, "tenant must not be empty"),
    ("tenant=42", {"tenant": 42}, InvalidArgument, "tenant must be a string, not int"),
    ("name=None", {"name": None}, InvalidArgument, "the workflow name must be a string, not NoneType"),
    ("NUL in the name", {"name": "sv_order\x00"}, InvalidArgument, "the workflow name contains a NUL character"),
    ("version='2'", {"version": "2"}, InvalidArgument, "version must be a whole number from 1 to 2147483647"),
    ("version=0", {"version": 0}, InvalidArgument, "version must be a whole number from 1 to 2147483647"),
    ("max_steps=-1", {"max_steps": -1}, InvalidArgument, "max_steps must be a whole number from 1 to 2147483647"),
    ("max_steps='5'", {"max_steps": "5"}, InvalidArgument, "max_steps must be a whole number from 1 to 2147483647"),
    ("max_steps=10**30", {"max_steps": 10**30}, InvalidArgument, "max_steps must be a whole number from 1"),
    ("max_steps=True", {"max_steps": True}, InvalidArgument, "max_steps must be a whole number"),
    ("max_cost=-0.5", {"max_cost": -0.5}, InvalidArgument, "max_cost must be between 0 and 99999999.999999"),
    ("max_cost=1e9", {"max_cost": 1e9}, InvalidArgument, "max_cost must be between 0 and"),
    ("max_cost='1'", {"max_cost": "1"}, InvalidArgument, "max_cost must be a finite number"),
    ("max_cost=inf", {"max_cost": math.inf}, InvalidArgument, "max_cost must be a finite number"),
    ("max_duration=60", {"max_duration": 60}, InvalidArgument, "max_duration must be a positive timedelta"),
    ("max_duration=-1s", {"max_duration": timedelta(seconds=-1)}, InvalidArgument,
     "max_duration must be a positive timedelta"),
    ("started_by='alice'", {"started_by": "alice"}, InvalidArgument, "started_by must be a saved user"),
    ("started_via=''", {"started_via": ""}, InvalidArgument, "started_via must not be empty"),
    ("started_via of 21 characters", {"started_via": "v" * 21}, InvalidArgument,
     "started_via is longer than 20 characters"),
]


@pytest.mark.parametrize("kwargs,error,fragment", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_it_refuses_a_bad_argument_before_touching_the_database(kwargs, error, fragment,
                                                                 django_assert_num_queries):
    arguments = {"name": "sv_order", "input": {"id": "o-1"}, "business_key": "o-1", **kwargs}
    with django_assert_num_queries(0), pytest.raises(error) as refused:
        start(arguments.pop("name"), arguments.pop("input"), **arguments)
    assert fragment in str(refused.value)
    assert isinstance(refused.value, ValueError) or error is NotSerializable
    assert WorkflowRun.objects.count() == 0 and JournalEntry.objects.count() == 0


def test_it_starts_at_the_limits():
    run = start("sv_order", {"deep": nested(63), "key": "é" * 1000}, business_key="k" * 200, tenant="t" * 100,
                max_steps=1, max_cost=0, max_duration=timedelta(seconds=1))
    stored = WorkflowRun.objects.get(id=run.id)
    assert stored.input == {"deep": nested(63), "key": "é" * 1000}
    assert (stored.business_key, stored.tenant, stored.max_steps, stored.max_cost) == ("k" * 200, "t" * 100, 1, 0)


def test_it_refuses_a_start_naming_another_version_than_the_existing_run():
    first = start("sv_order", {"id": "o-7"}, business_key="o-7", tenant="acme")
    assert first.version == 2
    with pytest.raises(StartConflict) as refused:
        start("sv_order", {"id": "o-7"}, business_key="o-7", tenant="acme", version=1)
    assert "at version 2, not the version 1 asked for" in str(refused.value)
    assert "nothing was started" in str(refused.value)
    assert start("sv_order", {"id": "o-7"}, business_key="o-7", tenant="acme", version=2).id == first.id
    assert start("sv_order", {"id": "o-7"}, business_key="o-7", tenant="acme").id == first.id
    assert list(WorkflowRun.objects.values_list("version", flat=True)) == [2]


@pytest.fixture
def alice():
    return get_user_model().objects.create(username="alice")


def test_it_refuses_what_postgresql_cannot_store_in_signals_comments_reasons_and_evidence(
        alice, django_assert_num_queries):
    run_id = uuid.uuid4()
    refusals = [
        (lambda: signal(run_id=run_id, name="paid", payload={"ref": "tx\x00"}), NotSerializable,
         "the signal's payload contains a NUL character"),
        (lambda: signal(run_id=run_id, name="paid", payload=nested(100_000)), NotSerializable,
         "nested deeper than 64 levels"),
        (lambda: signal(run_id=run_id, name="pa\x00id"), InvalidArgument, "the signal name contains a NUL"),
        (lambda: approve(approval_id=1, user=alice, comment="ok\x00"), InvalidArgument,
         "the comment contains a NUL character"),
        (lambda: reject(approval_id=1, user=alice, comment="x" * 4001), InvalidArgument,
         "the comment is longer than 4000 characters"),
        (lambda: cancel(run_id=run_id, reason="gone\x00", compensate=False), InvalidArgument,
         "reason contains a NUL character"),
        (lambda: cancel(run_id=run_id, reason=None, compensate=False), InvalidArgument,
         "reason must be a string, not NoneType"),
        (lambda: compensate(run_id=run_id, reason="undo\x00"), InvalidArgument, "reason contains a NUL character"),
        (lambda: retry(run_id=run_id, reason="r" * 4001), InvalidArgument, "reason is longer than 4000 characters"),
        (lambda: ledger.resolve(effect_id=1, outcome="failed", note="seen\x00"), InvalidResolution,
         "the note contains a NUL character"),
        (lambda: ledger.resolve(effect_id=1, outcome="succeeded", note="seen", downstream_ref="tx\x00"),
         InvalidResolution, "the downstream reference contains a NUL character"),
    ]
    for call, error, fragment in refusals:
        with django_assert_num_queries(0), pytest.raises(error, match=fragment.replace("(", r"\(")):
            call()
