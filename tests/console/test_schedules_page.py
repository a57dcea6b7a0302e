"""The console's schedules pages: every schedule with its next fire times and last ticks; one
schedule's page with its ticks and the operator's actions (pause, resume, trigger now, backfill
after a preview, delete), each audited; a stale page refused; hostile text escaped; a user
limited to some tenants sees only theirs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from operators.models import AuditEntry, TenantScope
from sagas import create_schedule, schedule
from sagas.models import Schedule, ScheduleTick, WorkflowRun
from sagas.testing import frozen_clock
from tests.console.conftest import client_for
from tests.sagas import wf_schedules  # noqa: F401  (registers sched_quick here)

pytestmark = pytest.mark.django_db
HOSTILE = "<img src=x onerror=alert(1)>"
T0 = datetime(2030, 4, 10, 12, 0, tzinfo=UTC)


def _nightly(name: str = "nightly", *, tenant: str = "default") -> Schedule:
    with frozen_clock(T0):
        return create_schedule("sched_quick", schedule(
            name, cron="30 2 * * *", timezone="Europe/Berlin", input={"note": HOSTILE}, tenant=tenant,
            business_key="night-{fire_time:%Y-%m-%d}", overlap="allow_all"))


def test_it_lists_each_schedule_with_its_next_fire_times_in_utc_and_local_time(people):
    _nightly()
    page = client_for(people["viewer"]).get("/schedules/").content.decode()
    assert "nightly" in page and "30 2 * * * (Europe/Berlin)" in page
    # 02:30 in Berlin (summer time) is 00:30 UTC; the page says both.
    assert "2030-04-11 00:30:00 UTC" in page and "(2030-04-11 02:30 CEST)" in page
    assert "none yet" in page
    detail = client_for(people["viewer"]).get("/schedules/nightly/").content.decode()
    assert HOSTILE not in detail and "&lt;img src=x onerror=alert(1)&gt;" in detail
    assert "Pause schedule" not in detail  # a viewer gets no forms


def test_an_operator_pauses_resumes_triggers_backfills_and_deletes_from_the_page(people):
    _nightly()
    olga = client_for(people["operator"])
    assert olga.post("/schedules/nightly/pause/", {"reason": "freeze", "expected": "active"}).status_code == 302
    assert Schedule.objects.get(name="nightly").paused
    stale = client_for(people["operator2"]).post("/schedules/nightly/pause/", {"reason": "x", "expected": "active"})
    assert stale.status_code == 409 and "is now paused" in stale.content.decode()
    assert olga.post("/schedules/nightly/resume/", {"reason": "over", "expected": "paused"}).status_code == 302

    olga.post("/schedules/nightly/trigger/", {"reason": "tonight's failed"})
    tick = ScheduleTick.objects.get(how="trigger")
    assert tick.outcome == "started" and tick.actor_label == "olga"
    page = olga.get("/schedules/nightly/").content.decode()
    assert "trigger by" in page and str(tick.run_id)[:8] in page

    window = "start=2030-03-30T00:00&end=2030-04-01T23:00"
    preview = olga.get(f"/schedules/nightly/?{window}").content.decode()
    table = preview.split("Backfill preview")[1].split("</table>")[0]
    assert "3 ticks, 3 to fire" in table
    # The night the clocks go forward (31 March 2030) has no 02:30: its tick is 03:00 CEST, 01:00 UTC.
    assert [t in table for t in ("2030-03-30 01:30:00", "2030-03-31 01:00:00", "2030-04-01 00:30:00")] == [True] * 3
    assert "night-2030-03-31" in table
    done = olga.post("/schedules/nightly/backfill/", {"start": "2030-03-30T00:00", "end": "2030-04-01T23:00",
                                                       "reason": "missed nights"})
    assert done.status_code == 302
    assert ScheduleTick.objects.filter(how="backfill", outcome="started").count() == 3
    again = olga.get(f"/schedules/nightly/?{window}").content.decode()
    assert "3 ticks, 0 to fire" in again and "Nothing to fire in this range." in again

    bad = olga.post("/schedules/nightly/backfill/", {"start": "yesterday", "end": "2030-03-30T23:00", "reason": "r"})
    assert bad.status_code == 400 and "is not a time" in bad.content.decode()
    assert olga.post("/schedules/nightly/delete/", {"reason": "obsolete", "expected": "active"}).status_code == 302
    assert not Schedule.objects.exists() and WorkflowRun.objects.count() == 4  # the runs stay
    assert list(AuditEntry.objects.filter(action__startswith="schedule.").order_by("id")
                .values_list("action", "outcome")) == [
        ("schedule.pause", "ok"), ("schedule.pause", "refused"), ("schedule.resume", "ok"),
        ("schedule.trigger", "ok"), ("schedule.backfill", "ok"), ("schedule.delete", "ok")]


def test_a_viewer_is_refused_every_action_and_the_attempt_is_audited(people):
    _nightly()
    vera = client_for(people["viewer"])
    assert vera.post("/schedules/nightly/trigger/", {"reason": "try"}).status_code == 403
    assert vera.post("/schedules/nightly/pause/", {"reason": "try", "expected": "active"}).status_code == 403
    assert not ScheduleTick.objects.exists() and not Schedule.objects.get(name="nightly").paused
    assert set(AuditEntry.objects.filter(action__startswith="schedule.").values_list("action", "outcome")) == {
        ("schedule.trigger", "denied"), ("schedule.pause", "denied")}


def test_a_user_limited_to_some_tenants_sees_only_their_schedules(people):
    _nightly("ours", tenant="acme")
    _nightly("theirs", tenant="globex")
    TenantScope.objects.create(user=people["operator"], tenants=["acme"])
    olga = client_for(people["operator"])
    page = olga.get("/schedules/").content.decode()
    assert "ours" in page and "theirs" not in page
    assert olga.get("/schedules/theirs/").status_code == 404
    assert olga.post("/schedules/theirs/trigger/", {"reason": "x"}).status_code == 404
    assert not ScheduleTick.objects.exists()
    assert AuditEntry.objects.get(action="schedule.trigger").tenant == "globex"  # shown to that tenant's users
    assert olga.get("/schedules/no-such/").status_code == 404


def test_an_operator_creates_a_schedule_from_the_page_and_a_bad_one_is_refused_with_what_was_typed(people):
    from sagas.models import WorkflowVersion

    WorkflowVersion.objects.create(name="sched_quick", version=1, definition_hash="q" * 64, module="m", source="")
    olga = client_for(people["operator"])
    form = {"name": "hourly-report", "workflow": "sched_quick", "cron": "0 * * * *", "timezone": "America/New_York",
            "every_seconds": "", "input": '{"report": "hourly"}', "tenant": "", "business_key": "",
            "jitter_seconds": "", "catch_up": "none", "catch_up_window_seconds": "", "overlap": "buffer_one",
            "reason": "ops asked for it"}
    page = olga.get("/schedules/").content.decode()
    assert "New schedule…" in page and '<option value="sched_quick">' in page
    made = olga.post("/schedules/", form)
    assert made.status_code == 302 and made["Location"] == "/schedules/hourly-report/"
    s = Schedule.objects.get(name="hourly-report")
    assert (s.cron, s.timezone, s.input, s.catch_up, s.overlap, s.source) == (
        "0 * * * *", "America/New_York", {"report": "hourly"}, "none", "buffer_one", "api")
    assert AuditEntry.objects.get(action="schedule.create").reason == "ops asked for it"

    for change, says, status in [
        ({"cron": "0 * * *"}, "five fields", 400),
        ({"cron": "", "every_seconds": ""}, "exactly one of cron and every", 400),
        ({"input": "{not json"}, "not JSON", 400),
        ({"business_key": "{fire_time:%Y}"}, "the same key", 400),
        ({"name": "bad name"}, "letters, digits", 400),
        ({}, "already a schedule named", 409),
    ]:
        answer = olga.post("/schedules/", {**form, **change})
        text = answer.content.decode()
        assert answer.status_code == status and says in text, (change, answer.status_code)
        assert "ops asked for it" in text  # what was typed is still there
    assert Schedule.objects.count() == 1
    assert client_for(people["viewer"]).post("/schedules/", form).status_code == 403
    assert "New schedule…" not in client_for(people["viewer"]).get("/schedules/").content.decode()
