"""Hostile strings in every query parameter, path segment and form field of every console URL,
as every role: never a 500, and never the hostile markup echoed unescaped in an HTML page.

The URLs come from the URLconf (``console:*``, every pattern, so a new page is fuzzed without
anyone listing it). Path converters get real ids (a run, an effect, an approval, an audit entry,
a payload kind), ids that match nothing, and every hostile string the converter accepts. Each
GET sends the parameters its view reads (the fields of its form) one at a time, and then every
parameter any console view reads all at once (a page whose form was fuzzed field by field gets
that one only with hostile markup, all it could add); each action is POSTed with one form field
at a time set to each hostile string and the others valid, so the hostile one reaches as deep as
it can. Viewers, operators, approvers and users with no console role GET with the markup values only
(``EVERY_GET_AS``), and POST the markup values only, but in the free text the role check audits
(``EVERY_POST_AS``). The live socket's parameters go to every live fragment's renderer.

Each request runs in a savepoint that is rolled back, so every one meets the same data (an
action that succeeds does not turn the next ones into "already done"), and a database error
in one cannot hide the next. The test prints the count and the time per role: 4,495
requests in all, about 50 s on the 2-core test machine.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, resolve, reverse

from console.forms import AuditFilterForm, RunFilterForm
from console.forms_queues import EffectFilterForm
from console.history_forms import HistoryPageForm
from console.models import BulkBatch, BulkItem, BulkState
from operators.models import AuditEntry, AuditOutcome
from sagas.models import RunStatus, Schedule, ScheduleTick, WorkflowVersion
from tests.console.conftest import client_for
from tests.console.queue_data import make_approval, make_effect, make_run
from tests.security.conftest import ROLES

pytestmark = pytest.mark.django_db

MARKUP = ("<img src=x onerror", "<script>alert")
HOSTILE = (
    "<img src=x onerror=alert(1)>",
    '"><script>alert(1)</script>',
    "a\x00b",  # a NUL inside text (a lone one is the same to every check)
    "9999-12-31",
    "0001-01-01",
    "-1",
    "99999999999999999999999",
    "%",
    "'",
    "\\",
    "\u202e",
    "x" * 5000,
    "[]",
    "1_99999999999999999999999",  # page cursors: a well-formed one out of every range
    "99999999999999999999999_1",
)
MARKED = tuple(value for value in HOSTILE if any(m in value for m in MARKUP))

# What each page's view reads from its query string (its form), by URL name. (The CSV export reads
# the audit page's filters with the same form: it gets them all at once, below.)
READS: dict[str, tuple[str, ...]] = {
    "runs": (*RunFilterForm.PARAMS, "after"),
    "schedule": ("start", "end"),
    "audit": (*AuditFilterForm.FILTERS, "after"),
    "effects": tuple(EffectFilterForm.base_fields),
    "run_history": tuple(HistoryPageForm.base_fields),
    "version_diff": ("a", "b"),
    "login": ("next",),
    "notifications": ("kind", "after"),
}
# Sent all at once to every URL, for views that read something not listed above.
EVERY_PARAM = sorted({
    *(p for params in READS.values() for p in params),
    "q", "after", "before", "tenant", "status", "workflow", "a", "b", "from", "to", "page", "fragments",
    "expected", "reason", "comment", "evidence", "outcome", "note", "decision", "downstream_ref", "run", "since",
    "download", "filters", "batch",
})
# A page parses its query string with the same code whoever asks; a role changes which controls it
# renders around what it echoes. So every hostile value goes into every GET as these (the most a
# page shows, and no login); the other roles GET with the markup (what a role's own controls
# could echo unescaped), and POST all.
EVERY_GET_AS = {"anonymous", "superuser"}
# Who POSTs every hostile value in every field; the other roles, mostly refused by the role check
# before the form is read, POST every hostile value in the free text that check audits (clipped)
# and the markup values in the other fields.
EVERY_POST_AS = {"superuser"}
AUDITED_TEXT = {"reason", "comment", "note"}
SCHEDULE = "nightly-settlement"
NOT_POSTED = {"logout"}  # a POST would log the client out


@dataclass
class Objects:
    run_id: uuid.UUID
    effect_id: int
    approval_id: int
    audit_id: int
    forms: dict[str, dict[str, str]] = field(default_factory=dict)  # a valid POST of each action
    queries: dict[str, dict[str, str]] = field(default_factory=dict)  # a valid query string, where one is needed
    bulk_token: uuid.UUID | None = None  # a confirmed bulk batch (console/views/bulk.py)

    def ids(self, url_name: str, name: str) -> list[object]:
        """Path values for the kwarg ``name``: the real one, ones that match nothing, hostile ones."""
        real = {"run_id": self.run_id, "effect_id": self.effect_id, "approval_id": self.approval_id,
                "entry_id": self.audit_id, "item_id": 1, "token": self.bulk_token, "name": SCHEDULE,
                "kind": {"audit_payload": "reason", "run_item_payload": "entry"}.get(url_name, "input")}.get(name)
        unknown = ([uuid.uuid4()] if name in ("run_id", "token") else ["no-such-schedule"] if name == "name"
                   else [123456789, 2**63, 10**30])
        return [v for v in (real, *unknown, *HOSTILE) if v is not None]


@pytest.fixture
def objects() -> Objects:
    run = make_run(status=RunStatus.NEEDS_ATTENTION, reason="budget_exceeded", business_key="<b>key</b>")
    effect = make_effect(connector="qp.lookup")
    approval = make_approval()
    a, b = (WorkflowVersion.objects.create(name=name, version=1, definition_hash=name[1] * 64, module="m",
                                           source=f"def f():\n    return {name!r}\n") for name in MARKED)
    forms = {
        "run_cancel": {"reason": "customer asked", "expected": run.status, "compensate": ""},
        "run_retry": {"reason": "fixed the budget", "expected": run.status},
        "run_compensate": {"reason": "undo it all", "expected": run.status},
        "effect_query": {"after": "", "filters": "connector=qp.lookup&q=key"},
        "effect_resolve": {"outcome": "succeeded", "downstream_ref": "ch_1", "note": "seen in the dashboard",
                           "expected": "UNKNOWN", "after": "", "filters": "age=1h&tenant=default"},
        "approval_decide": {"decision": "approve", "comment": "looks right", "expected": "PENDING"},
        "bulk_preview": {"action": "run.cancel", "scope": "filter", "status": "NEEDS_ATTENTION"},
        "bulk_confirm": {"action": "run.cancel", "reason": "closing them", "confirm": "yes", "outcome": "",
                         "downstream_ref": ""},
        "notification_endpoints": {"name": "ops", "url": "https://hooks.example.com/x", "format": "generic",
                                   "kinds": "unknown_effect", "tenants": "acme", "active": "on"},
        "schedules": {"name": "made-by-fuzz", "workflow": "qp_orders", "cron": "0 2 * * *", "timezone": "UTC",
                      "every_seconds": "", "input": '{"id": "x"}', "tenant": "default", "business_key": "",
                      "jitter_seconds": "", "catch_up": "last", "catch_up_window_seconds": "", "overlap": "skip",
                      "reason": "nightly"},
        "schedule_pause": {"reason": "month-end freeze", "expected": "active"},
        "schedule_resume": {"reason": "freeze over", "expected": "paused"},
        "schedule_delete": {"reason": "not needed", "expected": "active"},
        "schedule_trigger": {"reason": "rerun tonight's"},
        "schedule_backfill": {"start": "2030-01-01 00:00", "end": "2030-01-01 03:00", "reason": "missed night"},
        # A wrong password: never a login, and the failure the throttle records is rolled back.
        "login": {"username": "vera", "password": "not-her-password"},
    }
    queries = {"version_diff": {"a": str(a.id), "b": str(b.id)}}  # two workflows: not comparable
    schedule = Schedule.objects.create(
        name=SCHEDULE, workflow_name=MARKED[0], tenant="default", cron="0 2 * * *", timezone="UTC",
        input={"note": MARKED[1]}, business_key=MARKED[0] + "{fire_time_utc}", jitter=timedelta(0), catch_up="last",
        catch_up_window=timedelta(hours=1), overlap="skip", source="api", next_tick_at=datetime(2030, 1, 1, 2, tzinfo=UTC),
        due_at=datetime(2030, 1, 1, 2, tzinfo=UTC), paused_reason=MARKED[1])
    ScheduleTick.objects.create(schedule=schedule, tick_at=datetime(2029, 12, 31, 2, tzinfo=UTC), outcome="failed",
                                how="schedule", note=MARKED[0], handled_at=datetime(2029, 12, 31, 2, tzinfo=UTC),
                                actor_label=MARKED[1])
    entry = AuditEntry.objects.create(actor_label="olga", action="run.cancel", object_type="run",
                                      object_id=str(run.id), outcome=AuditOutcome.OK, reason=MARKED[0])
    author = get_user_model().objects.create(username="bulk-author")
    batch = BulkBatch.objects.create(token=uuid.uuid4(), user=author, user_label=MARKED[0], action="run.cancel",
                                     state=BulkState.DONE, reason=MARKED[1], total=1, refused=1)
    BulkItem.objects.create(batch=batch, object_type="run", object_id=str(run.id), expected=MARKED[0],
                            outcome="refused", message=MARKED[1])
    return Objects(run.id, effect.id, approval.id, entry.id, forms, queries, bulk_token=batch.token)


def console_patterns() -> list[tuple[str, list[str]]]:
    """(URL name, its path kwargs) of every ``console:`` pattern in the URLconf."""
    found: list[tuple[str, list[str]]] = []

    def walk(patterns: list, namespace: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, p.namespace or namespace)
            elif isinstance(p, URLPattern) and namespace == "console" and p.name:
                found.append((p.name, list(p.pattern.converters)))

    walk(get_resolver().url_patterns, "")
    return found


def urls(name: str, kwargs: list[str], objects: Objects) -> Iterator[tuple[str, bool]]:
    """(url, real) for ``name``: first with the real ids, then each kwarg varied alone with every
    value its converter accepts (``reverse`` refuses the others)."""
    real = {k: objects.ids(name, k)[0] for k in kwargs}
    yield reverse(f"console:{name}", kwargs=real), True
    for k in kwargs:
        for value in objects.ids(name, k)[1:]:
            try:
                yield reverse(f"console:{name}", kwargs={**real, k: value}), False
            except NoReverseMatch:
                continue


class Probe:
    """Sends requests, each in a rolled-back savepoint, and collects what went wrong."""

    def __init__(self, client: Client, role: str) -> None:
        self.client, self.role = client, role
        self.client.raise_request_exception = True
        self.sent = 0
        self.problems: list[str] = []
        self.took: Counter[str] = Counter()  # seconds per "METHOD url-name"

    def send(self, method: str, url: str, data: dict[str, str], *, htmx: bool = False) -> None:
        """One request; a view that raises (a 500 for a real visitor) or answers 5xx, or HTML
        with hostile markup in it, is a problem."""
        headers = {"HX-Request": "true"} if htmx else {}
        what = f"{self.role} {method} {url} {_short(data)}{' (htmx)' if htmx else ''}"
        self.sent += 1
        started = time.monotonic()
        try:
            with transaction.atomic():
                call = self.client.get if method == "GET" else self.client.post
                response = call(url, data, headers=headers)
                if hasattr(response, "streaming_content"):
                    body = b"".join(response.streaming_content).decode(errors="replace")
                else:
                    body = response.content.decode(errors="replace")
                transaction.set_rollback(True)
        except Exception as exc:  # the view raised: a 500 for a real visitor
            self.problems.append(f"{what}: 500 {type(exc).__name__}: {str(exc)[:120]}")
            return
        finally:
            self.took[f"{method} {resolve(url).url_name}"] += time.monotonic() - started
        if response.status_code >= 500:
            self.problems.append(f"{what}: {response.status_code}")
        if response.get("Content-Type", "").startswith("text/html"):
            for marker in MARKUP:
                if marker in body:
                    self.problems.append(f"{what}: {response.status_code} text/html echoes {marker!r} unescaped")


def _short(data: dict[str, str]) -> str:
    return " ".join(f"{k}={v[:24]!r}{'…' if len(v) > 24 else ''}" for k, v in data.items())


def fuzz(client: Client, role: str, objects: Objects) -> Probe:
    probe = Probe(client, role)
    for name, kwargs in console_patterns():
        for url, real in urls(name, kwargs, objects):
            query = objects.queries.get(name, {})
            probe.send("GET", url, query)
            if not real:
                continue
            for value in HOSTILE if role in EVERY_GET_AS else MARKED:
                for param in READS.get(name, ()):
                    probe.send("GET", url, {**query, param: value})
                if name not in READS or value in MARKED:  # a page whose form is fuzzed above: markup only
                    probe.send("GET", url, {param: value for param in EVERY_PARAM})
            if name in NOT_POSTED or name not in objects.forms or (name == "login" and role != "anonymous"):
                continue
            valid = objects.forms[name]
            probe.send("POST", url, valid)
            for value in HOSTILE:
                for param in valid:
                    if role not in EVERY_POST_AS and param not in AUDITED_TEXT and value not in MARKED:
                        continue
                    for htmx in (False, True) if value in MARKED else (False,):
                        probe.send("POST", url, {**valid, param: value}, htmx=htmx)
    return probe


def test_it_finds_every_console_url_in_the_urlconf():
    names = {name for name, _ in console_patterns()}
    assert {"runs", "run", "run_cancel", "effects", "effect_resolve", "approval_decide", "version_diff",
            "audit", "audit_csv"} <= names


@pytest.mark.parametrize("role", (*ROLES, "nobody"))
def test_it_answers_hostile_input_without_a_500_or_unescaped_markup(role, clients, people, objects, settings):
    """``nobody``: logged in, with no console role. (The login form is posted by the anonymous
    visitor only, with a fast hasher: each wrong password costs a real hash, 0.5 s.)"""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    started = time.monotonic()
    probe = fuzz(clients[role] if role in clients else client_for(people[role]), role, objects)
    took = time.monotonic() - started
    slowest = ", ".join(f"{k} {v:.1f} s" for k, v in probe.took.most_common(4))
    print(f"{role}: {probe.sent} requests in {took:.1f} s (slowest: {slowest})")
    assert probe.sent > 100
    assert probe.problems == [], f"{len(probe.problems)} of {probe.sent} requests:\n" + "\n".join(probe.problems)


def test_it_renders_every_live_fragment_for_hostile_socket_params(people, objects):
    """The live socket's query string (``/ws/live/?fragments=…&…``) reaches each fragment's
    renderer as ``params``: every parameter hostile at once, with and without a real run."""
    from console.live import FRAGMENTS

    problems = []
    for fragment in FRAGMENTS.values():
        for value in HOSTILE:
            for run in ({}, {"run": str(objects.run_id)}):
                params = {**{p: value for p in EVERY_PARAM}, **run}
                try:
                    with transaction.atomic():
                        html = fragment.render(people["viewer"], params)
                        transaction.set_rollback(True)
                except Exception as exc:
                    problems.append(f"{fragment.name} {value[:24]!r} {run}: {type(exc).__name__}: {exc}")
                    continue
                problems += [f"{fragment.name} {value[:24]!r}: echoes {m!r}" for m in MARKUP if m in html]
    assert problems == []
