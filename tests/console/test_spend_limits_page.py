"""The connectors page's spend limits: each tenant's daily limit on a connector with today's
spend and the runs parked at it, and the operator's form to set, raise or remove one, with its
audit entries, its refusals (role, tenant, stale page, bad amount) and a run parked at a limit
going on once the limit is raised there."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from console import live
from ledger import Connector, connector
from ledger.flow import services as flow
from ledger.flow import spend
from ledger.models import SpendDay, SpendLimit
from operators.models import AuditEntry, AuditOutcome, TenantScope
from sagas import Context, start, workflow
from sagas.models import RunStatus, WorkflowRun
from sagas.replay.engine import advance
from sagas.resolutions import runs_resume_cleared
from tests.console.conftest import client_for
from tests.console.queue_data import ESCAPED, HOSTILE, make_run, text

pytestmark = pytest.mark.django_db

PAGE = "/connectors/"
ACTION = "connector.spend_limit"


@connector("spendpage.complete")
class PricedCompletion(Connector):
    """A model call billed ``price`` usd, answered in-process."""

    def execute(self, payload, *, key):
        return {"text": f"answer to {payload['prompt']}"}

    def cost(self, payload, result):
        return float(payload["price"])


@workflow("spendpage_calls", version=1)
def spendpage_calls(ctx: Context, order: dict) -> dict:
    answers = [ctx.effect(f"complete-{i}", "spendpage.complete", {"prompt": f"part {i}", "price": order["price"]})
               for i in range(order["calls"])]
    return {"answers": len(answers)}


def set_limit(tenant: str, connector_name: str, per_day, by: str = "finance") -> None:
    flow.spend_limit_set(tenant=tenant, connector=connector_name, per_day=per_day, by=by)


def spent(tenant: str, connector_name: str, amount: str) -> None:
    SpendDay.objects.create(tenant=tenant, connector=connector_name, day=spend.today(), spent=Decimal(amount))


def parked_run(tenant: str, connector_name: str) -> WorkflowRun:
    """A run parked at ``tenant``'s limit on ``connector_name`` (as the engine leaves one)."""
    return make_run(status=RunStatus.NEEDS_ATTENTION, reason="spend_limit", tenant=tenant,
                    error={"code": "spend_limit", "tenant": tenant, "connector": connector_name,
                           "day": spend.today().isoformat(), "spent": 1.2, "limit": 1.0,
                           "message": f"tenant {tenant!r} has spent 1.2000 of its 1.0000 usd limit on "
                                      f"{connector_name} today"})


def region(page: str) -> str:
    found = re.search(r'<section id="live-connectors_spend".*?</section>', page, re.S)
    assert found, "no spend limits region"
    return found.group(0)


def row_of(page: str, tenant: str, connector_name: str) -> str:
    found = re.search(rf'<tr class="spend-limit[^"]*" id="[^"]*" data-tenant="{re.escape(tenant)}" '
                      rf'data-connector="{re.escape(connector_name)}">.*?</tr>', region(page), re.S)
    assert found, f"no row for {tenant} on {connector_name}"
    return found.group(0)


def form(tenant="acme", connector_name="model", per_day="2.5", expected="none", **changes) -> dict:
    data = {"tenant": tenant, "connector": connector_name, "per_day": per_day, "reason": "finance approved it",
            "expected": expected}
    data.update(changes)
    return data


def limit_of(tenant: str = "acme", connector_name: str = "model") -> Decimal | None:
    row = SpendLimit.objects.filter(tenant=tenant, connector=connector_name).first()
    return row.per_day if row else None


def audits() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=ACTION).order_by("id"))


def test_it_lists_each_limit_with_todays_spend_the_runs_parked_at_it_and_who_set_it(people):
    set_limit("acme", "model", "1", by="fiona")
    set_limit("globex", "model", "50")
    set_limit("*", "model", "5")
    spent("acme", "model", "1.2")
    spent("globex", "model", "3.25")
    spent("initech", "model", "5.5")  # no limit of its own: the every-tenant one holds it
    spent("umbrella", "model", "0.0004")
    spent("acme", "model.complete", "9")  # another connector, no limit on it
    parked_run("acme", "model")
    parked_run("acme", "model")
    parked_run("initech", "model")
    make_run(status=RunStatus.NEEDS_ATTENTION, reason="budget_exceeded", tenant="acme")  # parked for another reason

    page = text(client_for(people["viewer"]).get(PAGE))

    assert page.index('id="live-connectors_spend"') < page.index('id="live-connectors_list"')
    acme = row_of(page, "acme", "model")
    assert "attention" in acme.split(">")[0]  # reached
    assert re.search(r'spend-per-day">1\.00<', acme) and re.search(r'spend-spent">1\.20 <span class="badge', acme)
    assert re.search(r'spend-parked">2<', acme) and "<bdi>fiona</bdi>" in acme
    globex = row_of(page, "globex", "model")
    assert "attention" not in globex.split(">")[0] and "3.25" in globex and re.search(r'spend-parked">0<', globex)
    every = row_of(page, "*", "model")
    assert "every tenant" in every and re.search(r'spend-per-day">5\.00<', every)
    tenants = re.findall(r"<li><bdi>([^<]+)</bdi> ([0-9.]+)", every)
    assert tenants == [("initech", "5.50"), ("umbrella", "0.0004")]  # acme and globex have their own
    assert "(1 parked)" in every and re.search(r'spend-parked">1<', every)
    assert "model.complete" not in region(page)
    assert "<form" not in region(page)  # a viewer reads


def test_an_operator_sets_raises_and_removes_a_limit_each_audited(people):
    client = client_for(people["operator"])
    answer = client.post(PAGE, form(per_day="1.5"))
    assert answer.status_code == 302 and answer.url == f"{PAGE}#spend-limits"
    assert limit_of() == Decimal("1.5")
    row = SpendLimit.objects.get(tenant="acme", connector="model")
    assert row.changed_by_label == "olga"
    page = text(client.get(PAGE))
    assert "tenant acme&#x27;s daily spend limit on model is now 1.50 usd" in page  # the message
    shown = row_of(page, "acme", "model")
    assert 'name="expected" value="1.5"' in shown and "<bdi>olga</bdi>" in shown

    assert client.post(PAGE, form(per_day="4", expected="1.5")).status_code == 302
    assert limit_of() == Decimal("4")
    assert client.post(PAGE, form(per_day="", remove="1", expected="4.000000")).status_code == 302
    assert limit_of() is None
    assert "tenant acme has no daily spend limit on model any more" in text(client.get(PAGE))

    done = audits()
    assert [a.outcome for a in done] == [AuditOutcome.OK] * 3
    assert all((a.object_type, a.object_id, a.reason) == ("connector", "model", "finance approved it") for a in done)
    assert [(a.before["state"], a.after["state"]) for a in done] == [("none", "1.5"), ("1.5", "4"), ("4", "none")]
    assert done[1].after == {"state": "4", "tenant": "acme", "connector": "model", "per_day": "4", "by": "olga",
                             "at": done[1].after["at"]}


def test_an_operator_who_sees_every_tenant_sets_the_limit_for_every_tenant(people):
    client = client_for(people["operator"])
    assert client.post(PAGE, form(tenant="*", per_day="10")).status_code == 302
    assert limit_of("*") == Decimal("10")
    assert "every tenant" in row_of(text(client.get(PAGE)), "*", "model")


def test_it_refuses_a_viewer_and_someone_without_a_role_with_403_audited_and_nothing_changed(people):
    assert client_for(people["viewer"]).post(PAGE, form()).status_code == 403
    assert client_for(people["nobody"]).post(PAGE, form(per_day="-1")).status_code == 403
    assert client_for(people["approver"]).post(PAGE, form(tenant="*")).status_code == 403

    assert not SpendLimit.objects.exists()
    denied = audits()
    assert sorted(a.actor_label for a in denied) == ["ann", "nils", "vera"]
    assert {a.outcome for a in denied} == {AuditOutcome.DENIED} and {a.before for a in denied} == {None}


def test_an_operator_of_some_tenants_sets_only_theirs(people):
    limited = people["operator2"]
    TenantScope.objects.create(user=limited, tenants=["acme"])
    set_limit("globex", "model", "3")
    set_limit("*", "model", "5")
    spent("globex", "model", "9")
    client = client_for(limited)

    page = text(client.get(PAGE))
    spend_region = region(page)
    assert "globex" not in spend_region  # another tenant's limit and spend are not shown
    assert 'data-tenant="*"' in spend_region and "for operators who see every tenant" in spend_region
    assert '<select name="tenant" required><option value="acme">acme</option></select>' in spend_region
    assert "<form" not in page.split('id="live-connectors_list"')[1]  # still no connector forms

    assert client.post(PAGE, form(tenant="acme", per_day="2")).status_code == 302
    assert limit_of("acme") == Decimal("2")
    other = client.post(PAGE, form(tenant="globex", per_day="30", expected="3"), HTTP_HX_REQUEST="true")
    assert other.status_code == 403 and "oscar may set only the spend limits of their own tenants" in text(other)
    every = client.post(PAGE, form(tenant="*", per_day="50", expected="5"))  # without JavaScript: the 403 page
    assert every.status_code == 403
    new_tenant = client.post(PAGE, form(tenant="hooli", per_day="1"))
    assert new_tenant.status_code == 403

    assert (limit_of("globex"), limit_of("*"), limit_of("hooli")) == (Decimal("3"), Decimal("5"), None)
    done = audits()
    assert [(a.outcome, a.actor_label, a.tenant) for a in done] == [
        (AuditOutcome.OK, "oscar", "acme"), (AuditOutcome.DENIED, "oscar", "globex"),
        (AuditOutcome.DENIED, "oscar", ""), (AuditOutcome.DENIED, "oscar", "hooli")]
    assert {a.message for a in done[1:]} == {"outside the user's tenants"} and {a.before for a in done[1:]} == {None}
    # The audit log shows oscar his own tenant's entry; the attempt on globex is shown to globex's people.
    shown = re.findall(r'<tr id="audit-(\d+)"', text(client.get("/audit/?action=connector.spend_limit")))
    assert shown == [str(done[0].id)]
    everyone = re.findall(r'<tr id="audit-(\d+)"', text(client_for(people["viewer"]).get("/audit/?action=connector.spend_limit")))
    assert sorted(everyone) == sorted(str(a.id) for a in done)


def test_it_refuses_a_stale_page_and_a_double_submit_with_409_audited_and_applies_each_once(people):
    set_limit("acme", "model", "1")
    first, second = client_for(people["operator"]), client_for(people["operator2"])

    assert first.post(PAGE, form(per_day="2", expected="1")).status_code == 302
    twice = first.post(PAGE, form(per_day="2", expected="1"))  # the same form sent again
    assert twice.status_code == 409
    assert "tenant acme now has a daily spend limit of 2 usd on model (set by olga at " in text(twice)
    assert "you saw 1" in text(twice) and "nothing was changed" in text(twice)
    late = second.post(PAGE, form(per_day="", remove="1", expected="1"))
    assert late.status_code == 409 and limit_of() == Decimal("2")
    new = second.post(PAGE, form(per_day="7", expected="none"))  # "Set a spend limit" where one exists now
    assert new.status_code == 409 and limit_of() == Decimal("2")
    assert first.post(PAGE, form(per_day="", remove="1", expected="2")).status_code == 302
    gone = first.post(PAGE, form(per_day="", remove="1", expected="none"))  # nothing left to remove
    assert gone.status_code == 409 and "has no daily spend limit on model to remove" in text(gone)

    assert [a.outcome for a in audits()] == [AuditOutcome.OK, AuditOutcome.REFUSED, AuditOutcome.REFUSED,
                                             AuditOutcome.REFUSED, AuditOutcome.OK, AuditOutcome.REFUSED]
    assert audits()[1].before["state"] == "2"  # what was found under the lock, not what the page showed


@pytest.mark.parametrize(("changes", "says"), [
    ({"per_day": "lots"}, "Daily limit (usd) must be a number"),
    ({"per_day": "-1"}, "Daily limit (usd) must be between 0 and 99999999.999999"),
    ({"per_day": "100000000"}, "Daily limit (usd) must be between 0 and"),
    ({"per_day": "1e300"}, "Daily limit (usd) must be between 0 and"),
    ({"per_day": "NaN"}, "Daily limit (usd) must be a number"),
    ({"per_day": "Infinity"}, "Daily limit (usd) must be a number"),
    ({"per_day": "0.0000001"}, "Daily limit (usd) has at most 6 decimal places"),
    ({"per_day": "1,5"}, "Daily limit (usd) must be a number"),
    ({"per_day": ""}, "Daily limit (usd) is required"),
    ({"per_day": "9" * 41}, "Daily limit (usd) is longer than 40 characters"),
    ({"tenant": ""}, "Say which tenant"),
    ({"tenant": "t" * 101}, "Tenant is longer than 100 characters"),
    ({"connector": ""}, "Say which connector"),
    ({"connector": "c" * 201}, "Connector is longer than 200 characters"),
    ({"reason": ""}, "A reason is required"),
    ({"expected": ""}, "The form did not say which state you saw"),
], ids=lambda v: f"{next(iter(v))}={next(iter(v.values()))[:12]}" if isinstance(v, dict) else None)
def test_it_answers_a_malformed_amount_or_name_with_400_naming_the_field_and_changes_nothing(people, changes, says):
    set_limit("acme", "model", "1")
    client = client_for(people["operator"])

    answer = client.post(PAGE, form(**{"expected": "1", **changes}))

    assert answer.status_code == 400
    assert says in text(answer) and "nothing was changed" in text(answer).lower()
    assert limit_of() == Decimal("1") and not audits()


def test_it_keeps_zero_and_six_decimal_places_as_typed(people):
    client = client_for(people["operator"])
    assert client.post(PAGE, form(per_day="0")).status_code == 302
    assert limit_of() == Decimal("0")
    assert client.post(PAGE, form(per_day="12.345678", expected="0")).status_code == 302
    assert limit_of() == Decimal("12.345678")
    assert 'name="expected" value="12.345678"' in row_of(text(client.get(PAGE)), "acme", "model")


def test_it_shows_hostile_tenant_and_connector_names_and_reasons_as_text(people):
    client = client_for(people["operator"])
    assert client.post(PAGE, form(tenant=f"t{HOSTILE}", connector_name=f"c{HOSTILE}", per_day="1")).status_code == 302
    spent(f"u{HOSTILE}", "model", "2")
    set_limit("*", "model", "1")

    page = text(client.get(PAGE))
    fragment = text(client.get(f"{PAGE}?part=spend", HTTP_HX_REQUEST="true"))
    for html in (page, fragment):
        assert HOSTILE not in html
        assert f"<bdi>t{ESCAPED}</bdi>" in html and f"c{ESCAPED}" in html and f"u{ESCAPED}" in html
    assert limit_of(f"t{HOSTILE}", f"c{HOSTILE}") == Decimal("1")  # stored as given
    refused = client.post(PAGE, form(tenant=f"t{HOSTILE}", connector_name=f"c{HOSTILE}", per_day="2"))
    assert refused.status_code == 409 and HOSTILE not in text(refused) and ESCAPED in text(refused)


def test_it_answers_an_htmx_post_with_the_region_and_the_result_out_of_band(people):
    client = client_for(people["operator"])

    done = client.post(PAGE, form(per_day="3"), HTTP_HX_REQUEST="true")
    assert done.status_code == 200
    html = text(done)
    assert html.lstrip().startswith('<section id="live-connectors_spend"') and "<html" not in html
    assert "hx-swap-oob" in html and "is now 3.00 usd" in html
    assert 'name="expected" value="3"' in row_of(html, "acme", "model")

    again = client.post(PAGE, form(per_day="3"), HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "now has a daily spend limit of 3 usd" in text(again)
    bad = client.post(PAGE, form(per_day="-2", expected="3"), HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "must be between 0 and" in text(bad) and "<html" not in text(bad)
    # The region polls itself; the forms keep their CSRF token through the page's htmx header.
    poll = text(client.get(f"{PAGE}?part=spend", HTTP_HX_REQUEST="true"))
    assert poll.lstrip().startswith('<section id="live-connectors_spend"') and 'hx-trigger="every 5s"' in poll
    assert "X-CSRFToken" in text(client.get(PAGE))


def test_a_connectors_push_renders_without_the_spend_region(people):
    """The websocket pushes the connectors region only; the spend limits poll for themselves."""
    set_limit("acme", "model", "1")
    pushed = live.FRAGMENTS["connectors_list"].render(people["operator"], {})
    assert "live-connectors_spend" not in pushed


@pytest.mark.django_db(transaction=True)
def test_raising_the_limit_on_the_page_lets_the_sweeper_resume_a_run_parked_at_it(people):
    """A real run, driven in this process as a worker would: it parks at its tenant's limit,
    the run page says why with the figures, and once an operator raises the limit on the page,
    the sweeper's re-check resumes it and it finishes."""
    set_limit("acme", "spendpage.complete", "1")
    run = start("spendpage_calls", {"calls": 4, "price": 0.4}, tenant="acme")
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (RunStatus.NEEDS_ATTENTION, "spend_limit")
    assert (run.error["tenant"], run.error["connector"], run.error["limit"]) == ("acme", "spendpage.complete", 1.0)
    client = client_for(people["operator"])

    run_page = text(client.get(f"/runs/{run.id}/"))
    assert "tenant &#x27;acme&#x27; has spent 1.2000 of its 1.0000 usd limit on spendpage.complete today" in run_page
    row = row_of(text(client.get(PAGE)), "acme", "spendpage.complete")
    assert re.search(r'spend-parked">1<', row) and re.search(r'spend-spent">1\.20 ', row)

    assert runs_resume_cleared() == []  # still over its limit: it stays parked
    assert client.post(PAGE, form(connector_name="spendpage.complete", per_day="2", expected="1")).status_code == 302
    assert runs_resume_cleared() == [str(run.id)]
    advance(str(run.id), owner="t")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED and run.result == {"answers": 4}
    assert SpendDay.objects.get(tenant="acme", connector="spendpage.complete").spent == Decimal("1.6")
    assert re.search(r'spend-parked">0<', row_of(text(client.get(PAGE)), "acme", "spendpage.complete"))


def test_an_every_tenant_limit_of_zero_shows_a_tenant_parked_at_it_without_spend(people):
    set_limit("*", "model", "0")
    parked_run("acme", "model")
    row = row_of(text(client_for(people["viewer"]).get(PAGE)), "*", "model")
    assert re.search(r"<li><bdi>acme</bdi> 0\.00 <span class=\"badge NEEDS_ATTENTION\">reached</span>", row)
    assert "(1 parked)" in row


def test_it_says_when_no_limit_is_set_and_which_utc_day_the_spend_is_counted_in(people):
    page = text(client_for(people["viewer"]).get(PAGE))
    assert f"today is {spend.today():%Y-%m-%d} UTC" in page
    assert "No spend limit is set: every tenant may spend without limit." in page
