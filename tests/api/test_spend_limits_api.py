"""Tenants' daily spend limits over the HTTP API (``/spend-limits``): each limit with today's
spend and the runs parked at it; set, raise and remove one with the operator role, a key that
sees the tenant, the limit the caller saw and an audit entry; malformed amounts refused naming
the field; a run parked at a limit resumed by the sweeper once the limit is raised."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from ledger.flow import services as flow
from ledger.flow import spend
from ledger.models import SpendDay, SpendLimit
from operators.models import AuditEntry
from sagas.models import RunStatus
from sagas.resolutions import runs_resume_cleared
from tests.api.actions_data import call, problem
from tests.api.conftest import login
from tests.console.queue_data import make_run

pytestmark = pytest.mark.django_db

ACTION = "connector.spend_limit"
HOSTILE = "<img src=x onerror=alert(1)>"  # no "/": it goes in the path


def path(tenant: str = "acme", connector: str = "model") -> str:
    return f"/spend-limits/{tenant}/{connector}"


def body(per_day=2.5, expected="none", **changes) -> dict:
    return {"per_day": per_day, "reason": "finance approved it", "expected": expected, **changes}


def set_limit(tenant: str, connector: str, per_day, by: str = "finance") -> None:
    flow.spend_limit_set(tenant=tenant, connector=connector, per_day=per_day, by=by)


def spent(tenant: str, connector: str, amount: str) -> None:
    SpendDay.objects.create(tenant=tenant, connector=connector, day=spend.today(), spent=Decimal(amount))


def parked_run(tenant: str, connector: str):
    """A run parked at ``tenant``'s limit on ``connector``, as the engine leaves one."""
    return make_run(status=RunStatus.NEEDS_ATTENTION, reason="spend_limit", tenant=tenant,
                    error={"code": "spend_limit", "tenant": tenant, "connector": connector,
                           "day": spend.today().isoformat(), "spent": 1.2, "limit": 1.0,
                           "message": f"tenant {tenant!r} has spent 1.2000 of its 1.0000 usd limit"})


def limit_of(tenant: str = "acme", connector: str = "model") -> Decimal | None:
    row = SpendLimit.objects.filter(tenant=tenant, connector=connector).first()
    return row.per_day if row else None


def audits() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=ACTION).order_by("id"))


def test_it_lists_each_limit_with_todays_spend_and_the_runs_parked_at_it(keys):
    set_limit("acme", "model", "1")
    set_limit("globex", "model", "50")
    set_limit("*", "model", "5")
    spent("acme", "model", "1.2")
    spent("globex", "model", "3.25")
    spent("initech", "model", "5.5")  # no limit of its own: the every-tenant one holds it
    parked_run("acme", "model")
    parked_run("initech", "model")

    listed = call("get", "/spend-limits", keys["viewer"])
    assert listed.status_code == 200 and listed["Content-Type"].startswith("application/json")
    by_tenant = {limit["tenant"]: limit for limit in listed.json()}
    assert [limit["tenant"] for limit in listed.json()] == ["*", "acme", "globex"]
    acme = by_tenant["acme"]
    assert (acme["per_day"], acme["state"], acme["spent_today"], acme["reached"], acme["runs_parked"]) \
        == (1.0, "1", 1.2, True, 1)
    assert (acme["changed_by"], acme["day"], acme["tenants"]) == ("finance", spend.today().isoformat(), None)
    assert (by_tenant["globex"]["reached"], by_tenant["globex"]["runs_parked"]) == (False, 0)
    every = by_tenant["*"]
    assert (every["per_day"], every["spent_today"], every["runs_parked"]) == (5.0, 5.5, 1)
    assert every["tenants"] == [{"tenant": "initech", "spent_today": 5.5, "runs_parked": 1, "reached": True}]

    only = call("get", "/spend-limits?connector=model&tenant=globex", keys["viewer"]).json()
    assert [(limit["tenant"], limit["connector"]) for limit in only] == [("globex", "model")]
    # A key limited to acme sees acme's limit and the every-tenant one, counted for acme only.
    limited = call("get", "/spend-limits", keys["acme-operator"]).json()
    assert [(limit["tenant"], limit["spent_today"], limit["runs_parked"]) for limit in limited] \
        == [("*", 0.0, 0), ("acme", 1.2, 1)]
    assert limited[0]["tenants"] == []
    assert call("get", "/spend-limits").status_code == 401


def test_a_key_sets_raises_and_removes_a_limit_each_audited(keys):
    done = call("put", path(), keys["operator"], body(per_day=1.5))
    assert done.status_code == 200, done.content
    assert done.json()["message"] == "tenant acme's daily spend limit on model is now 1.5 usd"
    limit = done.json()["limit"]
    assert (limit["tenant"], limit["connector"], limit["per_day"], limit["state"], limit["changed_by"]) \
        == ("acme", "model", 1.5, "1.5", "system: api key operator")
    assert limit_of() == Decimal("1.5")

    raised = call("put", path(), keys["operator"], body(per_day="4.000", expected="1.50"))  # text, as written
    assert raised.status_code == 200 and raised.json()["limit"]["state"] == "4"
    removed = call("put", path(), keys["operator"], body(per_day=None, expected="4"))
    assert removed.status_code == 200, removed.content
    assert removed.json() == {"message": "tenant acme has no daily spend limit on model any more", "limit": None}
    assert limit_of() is None and call("get", "/spend-limits", keys["viewer"]).json() == []

    entries = audits()
    assert [(a.outcome, a.actor_label) for a in entries] == [("ok", "system: api key operator")] * 3
    assert all((a.object_type, a.object_id, a.tenant, a.reason) == ("connector", "model", "acme", "finance approved it")
               for a in entries)
    assert [(a.before["state"], a.after["state"]) for a in entries] == [("none", "1.5"), ("1.5", "4"), ("4", "none")]


def test_a_key_that_sees_every_tenant_sets_the_limit_for_every_tenant(keys):
    done = call("put", path("*"), keys["operator"], body(per_day=10))
    assert done.status_code == 200, done.content
    assert done.json()["message"] == "every tenant's daily spend limit on model is now 10 usd"
    assert limit_of("*") == Decimal("10")
    [entry] = audits()
    assert (entry.outcome, entry.tenant, entry.after["tenant"]) == ("ok", "", "*")


def test_it_refuses_a_key_without_the_operator_role_and_one_outside_the_tenant_with_403_audited(keys):
    set_limit("globex", "model", "3")
    for role in ("viewer", "approver"):
        answer = call("put", path(), keys[role], body())
        assert answer.status_code == 403 and problem(answer) == "forbidden"
        assert "needs the operator role" in answer.json()["detail"]

    assert call("put", path("acme"), keys["acme-operator"], body(per_day=2)).status_code == 200
    other = call("put", path("globex"), keys["acme-operator"], body(per_day=30, expected="3"))
    assert other.status_code == 403 and problem(other) == "forbidden"
    assert other.json()["detail"] == "system: api key acme-operator may set only the spend limits of their own tenants"
    every = call("put", path("*"), keys["acme-operator"], body(per_day=50))
    assert every.status_code == 403 and "for every tenant" in every.json()["detail"]

    assert (limit_of("acme"), limit_of("globex"), limit_of("*")) == (Decimal("2"), Decimal("3"), None)
    assert [(a.outcome, a.actor_label.removeprefix("system: api key "), a.tenant, a.before) for a in audits()] == [
        ("denied", "viewer", "acme", None), ("denied", "approver", "acme", None),
        ("ok", "acme-operator", "acme", {"state": "none", "tenant": "acme", "connector": "model"}),
        ("denied", "acme-operator", "globex", None), ("denied", "acme-operator", "", None)]


def test_a_limit_changed_since_the_caller_read_it_is_a_409_and_nothing_changes(keys):
    set_limit("acme", "model", "1")
    assert call("put", path(), keys["operator"], body(per_day=2, expected="1")).status_code == 200

    twice = call("put", path(), keys["operator"], body(per_day=2, expected="1"))  # the same request again
    assert twice.status_code == 409 and problem(twice) == "stale-state"
    assert twice.json()["detail"].startswith("tenant acme now has a daily spend limit of 2 usd on model (set by "
                                             "system: api key operator at ")
    late = call("put", path(), keys["operator2"], body(per_day=None, expected="1"))
    assert late.status_code == 409 and problem(late) == "stale-state"
    new = call("put", path(), keys["operator2"], body(per_day=7, expected="none"))  # it exists now
    assert new.status_code == 409 and problem(new) == "stale-state"
    assert limit_of() == Decimal("2")

    missing = call("put", path(), keys["operator"], body(per_day=3, expected=""))
    assert missing.status_code == 400 and problem(missing) == "validation"
    assert missing.json()["detail"].startswith("send `expected`")
    gone = call("put", path("acme", "email.send"), keys["operator"], body(per_day=None, expected="none"))
    assert gone.status_code == 409 and problem(gone) == "conflict"
    assert "has no daily spend limit on email.send to remove" in gone.json()["detail"]

    assert limit_of() == Decimal("2") and limit_of("acme", "email.send") is None
    assert [a.outcome for a in audits()] == ["ok", "refused", "refused", "refused", "refused", "refused"]
    assert audits()[1].before["state"] == "2"  # what was found under the lock


@pytest.mark.parametrize(("per_day", "says"), [
    pytest.param("lots", "valid decimal", id="text"),
    pytest.param("1,5", "valid decimal", id="comma"),
    pytest.param(-1, "must be between 0 and 99999999.999999", id="negative"),
    pytest.param(100_000_000, "must be between 0 and", id="over-max"),
    pytest.param(1e300, "must be between 0 and", id="huge"),
    pytest.param("0.0000001", "at most 6 decimal places", id="seven-places"),
    pytest.param(0.1234567, "at most 6 decimal places", id="seven-places-number"),
    pytest.param(True, "Decimal input", id="bool"),
    pytest.param([1], "Decimal input", id="list"),
    pytest.param("NaN", "finite number", id="nan-text"),
])
def test_it_refuses_a_malformed_amount_naming_the_field_and_changes_nothing(keys, per_day, says):
    set_limit("acme", "model", "1")
    answer = call("put", path(), keys["operator"], body(per_day=per_day, expected="1"))
    assert answer.status_code == 400 and problem(answer) == "validation", answer.content
    named = [str(part) for error in answer.json().get("errors", []) for part in error["loc"]]
    assert "per_day" in named, answer.json()
    assert says in json.dumps(answer.json()), answer.json()
    assert limit_of() == Decimal("1") and not audits()


def test_it_refuses_an_amount_left_out_or_not_json_and_a_name_that_cannot_be_one(keys):
    left_out = call("put", path(), keys["operator"], {"reason": "r", "expected": "none"})
    assert left_out.status_code == 400 and "per_day" in json.dumps(left_out.json()["errors"])
    for raw in (b'{"per_day": NaN, "reason": "r", "expected": "none"}',
                b'{"per_day": Infinity, "reason": "r", "expected": "none"}'):
        answer = call("put", path(), keys["operator"], raw=raw)
        assert answer.status_code == 400 and problem(answer) == "validation", answer.content
    spaced = call("put", path("%20acme"), keys["operator"], body())
    assert spaced.status_code == 400 and "tenant: " in spaced.json()["detail"]
    long = call("put", path("acme", "c" * 201), keys["operator"], body())
    assert long.status_code == 400 and "connector: " in long.json()["detail"]
    assert not SpendLimit.objects.exists() and not audits()


def test_hostile_names_and_reasons_are_kept_as_text_and_escaped_on_the_console(keys):
    done = call("put", path(f"t{HOSTILE}", f"c{HOSTILE}"), keys["operator"], body(per_day=1, reason=HOSTILE))
    assert done.status_code == 200, done.content
    assert done["Content-Type"].startswith("application/json")  # never markup
    assert (done.json()["limit"]["tenant"], done.json()["limit"]["connector"]) == (f"t{HOSTILE}", f"c{HOSTILE}")
    assert limit_of(f"t{HOSTILE}", f"c{HOSTILE}") == Decimal("1") and audits()[0].reason == HOSTILE

    page = login("vera", "viewer").get("/connectors/").content.decode()
    assert HOSTILE not in page and "t&lt;img src=x onerror=alert(1)&gt;" in page


def test_raising_a_limit_lets_the_sweeper_resume_the_runs_parked_at_it(keys):
    set_limit("acme", "model", "1")
    spent("acme", "model", "1.2")
    run = parked_run("acme", "model")
    [limit] = call("get", "/spend-limits", keys["viewer"]).json()
    assert (limit["reached"], limit["runs_parked"]) == (True, 1)

    assert runs_resume_cleared() == []  # still over the limit: it stays parked
    assert call("put", path(), keys["operator"], body(per_day=2, expected=limit["state"])).status_code == 200
    assert runs_resume_cleared() == [str(run.id)]
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    [limit] = call("get", "/spend-limits", keys["viewer"]).json()
    assert (limit["reached"], limit["runs_parked"]) == (False, 0)


def test_a_json_numbers_float_noise_is_the_amount_it_stands_for(keys):
    """0.1 + 0.2 reaches the server as 0.30000000000000004 (a binary float): within 1e-9 of a
    6-place amount, it is that amount, stored exactly; the schema says multipleOf 0.000001."""
    answer = call("put", path(), keys["operator"], body(per_day=0.1 + 0.2))
    assert answer.status_code == 200, answer.content
    assert limit_of() == Decimal("0.3")
