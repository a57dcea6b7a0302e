"""The product demo's load: an order agent started every second or so, with faults at a steady rate.

``LoadGenerator.tick()`` is called from ``manage.py demo``'s main loop, in the demo's
own process, against the database the whole demo uses. Within the first ten orders
the console has something in every queue, and it keeps having some:

=========================================  ==================================================
order number ``n``                          what it meets
=========================================  ==================================================
``n % 10 == 2``                             ``timeout_after_work`` on ``email.send``: sent, no
                                            answer, no lookup: UNKNOWN until a person resolves it
``n % 10 == 4``                             ``timeout_after_work`` on ``payments.capture``:
                                            UNKNOWN until the reconciler's lookup settles it
``n % 10 == 7``                             ``final`` on ``inventory.reserve``: the run fails
                                            and compensates (the capture is refunded)
``n % 3 == 0``                              its shipment approval is left for a person
every other order                           approved by the ``demo-bot`` user after a moment,
                                            audited as ``system: approver-bot``
=========================================  ==================================================

A fault is injected into the providers' fault table (``demo.providers.faults.inject``)
and hits the next request to that operation, so it lands on this order or on one
close to it. Caps keep the queues at a size a person can work through: no new email
fault while ``UNKNOWN_EMAIL_CAP`` emails are UNKNOWN, no approval left for a person
while ``HUMAN_APPROVAL_CAP`` are open, no new order while ``BACKLOG_CAP`` wait for a
worker. Nothing here is needed for correctness: it only feeds the demo.

PostgreSQL or Redis going away does not stop it (``Outage``): ``tick()`` drops the
dead database connection, logs one line when the outage starts and one when it ends
(with its length; ``core.storage.OUTAGES``), tries again after a backoff with jitter
(up to 4 s), and carries on where it was: an order whose start failed is started again
with the same input and business key, so it is started once however the failure fell.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from core.storage import OUTAGES, POSTGRES, REDIS, Backoff, is_storage_error, note_failure, note_success
from demo.models import ProviderFault
from demo.providers.faults import FINAL, TIMEOUT_AFTER_WORK, inject
from ledger.models import EffectKind, EffectRecord, EffectStatus
from operators import roles
from operators.services.actions import Actor, Denied, Refused
from operators.services.queues import approval_act
from sagas import start
from sagas.integration import redis_connection
from sagas.models import OPEN_APPROVAL_STATES, TERMINAL_STATUSES, ApprovalRequest, ApprovalState, RunStatus, WorkflowRun

WORKFLOW = "order_agent"
BOT_USERNAME = "demo-bot"
BOT_ACTOR = "approver-bot"  # how the audit log names it: "system: approver-bot"
BOT_COMMENT = "auto-approved by the demo bot: address verified, low value"
UNKNOWN_EMAIL_CAP = 6
HUMAN_APPROVAL_CAP = 8
BACKLOG_CAP = 25
BACKOFF_FIRST = 0.25  # seconds before the first retry in an outage; doubled on each failure...
BACKOFF_MAX = 4.0  # ...up to this; each wait is 50-100% of it (jitter, core.storage.Backoff)

# (order number modulo 10) -> (provider, operation, fault, what the console will show)
FAULTS: dict[int, tuple[str, str, str, str]] = {
    2: ("email", "send", TIMEOUT_AFTER_WORK, "email UNKNOWN"),
    4: ("payments", "capture", TIMEOUT_AFTER_WORK, "capture UNKNOWN, reconciled"),
    7: ("inventory", "reserve", FINAL, "reservation refused, compensation"),
}

_CUSTOMERS = (
    ("Ada", "ada@example.com", "London"),
    ("Grace", "grace@example.org", "Arlington"),
    ("Katherine", "katherine@example.net", "Hampton"),
    ("Edsger", "edsger@example.nl", "Nuenen"),
    ("Barbara", "barbara@example.com", "Boston"),
    ("Alan", "alan@example.co.uk", "Wilmslow"),
    ("Margaret", "margaret@example.com", "Paoli"),
)
_SKUS = ("SKU-KETTLE", "SKU-LAMP", "SKU-CHAIR", "SKU-BOOK", "SKU-MUG")
_TENANTS = ("acme", "acme", "globex")


def make_order(n: int, batch: str, rng: random.Random) -> dict:
    name, email, city = _CUSTOMERS[n % len(_CUSTOMERS)]
    qty = rng.randint(1, 3)
    return {
        "id": f"order-{batch}-{n:04d}",
        "customer": name,
        "email": email,
        "sku": rng.choice(_SKUS),
        "qty": qty,
        "amount_cents": qty * rng.choice((1299, 2499, 4999, 8900)),
        "currency": "EUR",
        "address": {"street": f"{rng.randint(1, 200)} High Street", "city": city},
    }


def bot_user() -> User:
    """The approver bot: an approver who cannot log in. Its decisions carry its name."""
    roles.ensure_groups()
    user, created = get_user_model().objects.get_or_create(username=BOT_USERNAME)
    if created:
        user.set_unusable_password()
        user.save()
    user.groups.add(Group.objects.get(name=roles.APPROVER))
    return user


def bot_approve(approval_id: int, bot: User) -> bool:
    """Approve as the demo's approver bot, through the console's action frame like a person's
    decision: role and four-eyes checked, and one audit entry by ``system: approver-bot`` in the
    decision's transaction. False when it was not approved (someone was quicker, or the run
    ended): that refusal is audited too."""
    try:
        approval_act(Actor(user=bot, ip=None, system=BOT_ACTOR), approval_id=approval_id, approve=True,
                     comment=BOT_COMMENT, expected=ApprovalState.PENDING)
    except (Refused, Denied):
        return False
    return True


@dataclass
class Status:
    """What the demo's one-line status reports; read from PostgreSQL, as the console does."""

    runs: dict[str, int]
    unknown_effects: int
    pending_approvals: int

    def line(self) -> str:
        order = [s.value for s in RunStatus]
        runs = ", ".join(f"{n} {s}" for s, n in sorted(self.runs.items(), key=lambda kv: order.index(kv[0])))
        return (f"runs: {runs or 'none yet'} | unknown effects: {self.unknown_effects} | "
                f"pending approvals: {self.pending_approvals}")


def status() -> Status:
    runs = dict(WorkflowRun.objects.values_list("status").annotate(n=Count("id")).order_by())
    return Status(
        runs=runs,
        unknown_effects=EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).count(),
        pending_approvals=ApprovalRequest.objects.filter(state__in=OPEN_APPROVAL_STATES).count(),
    )


class Outage:
    """When the load may be tried again after PostgreSQL or Redis failed it (``retry_at``, monotonic).

    Reporting is the process's own (``core.storage.OUTAGES``): one line when an outage
    starts and one when it ends, with its length, whoever in this process saw it first
    (the load generator, or the engine's enqueue inside ``start()``). ``failed()`` also
    drops the dead database connection, so the next query opens a new one.
    """

    def __init__(self) -> None:
        self.since: float | None = None  # when the load generator's current outage began
        self.ended_at: float | None = None  # when its last one ended
        self.retry_at = 0.0
        self._backoff = Backoff(base=BACKOFF_FIRST, cap=BACKOFF_MAX)

    @property
    def active(self) -> bool:
        return self.since is not None

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def recent(self, now: float, *, within: float) -> bool:
        """Whether an outage is going on or ended less than ``within`` seconds ago."""
        return self.since is not None or (self.ended_at is not None and now - self.ended_at < within)

    def failed(self, exc: BaseException, now: float) -> None:
        note_failure(exc, doing="starting the demo's orders (the load pauses)")
        if self.since is None:
            self.since, self._backoff = now, Backoff(base=BACKOFF_FIRST, cap=BACKOFF_MAX)
        self.retry_at = now + self._backoff.next_delay()

    def succeeded(self, now: float) -> None:
        """Call after both servers answered (``probe()``)."""
        if self.since is not None:
            self.since, self.ended_at, self.retry_at = None, now, 0.0


def probe() -> None:
    """Ask Redis and PostgreSQL whether they answer; say so if one was noted unreachable. Raises if not."""
    redis_connection().ping()
    note_success(REDIS)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    note_success(POSTGRES)


@dataclass
class LoadGenerator:
    """Starts ``order_agent`` runs every ``interval`` seconds, injects faults, plays the approver bot."""

    interval: float = 1.0
    bot_delay: float = 1.5
    seed: int | None = None
    log: Callable[[str], None] = print
    started: int = 0
    injected: Counter = field(default_factory=Counter)
    bot_approvals: int = 0
    batch: str = field(default_factory=lambda: time.strftime("%H%M%S"))

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.outage = Outage()
        self._bot = bot_user()
        self._for_bot: set[str] = set()
        self._next_start = 0.0
        self._next_purge = 0.0
        self._order: dict | None = None  # the next order (number started + 1), kept until its start succeeds
        self._faulted = False  # whether that order's fault has been decided

    def tick(self, now: float) -> bool:
        """Start an order if one is due, and approve the bot's orders that have waited long enough.

        Returns whether PostgreSQL and Redis answered. While they do not, it does
        nothing until ``outage.retry_at``; it never raises for a server that is
        unreachable or a connection that was dropped (``core.storage.is_storage_error``).
        """
        if not self.outage.due(now):
            return False
        try:
            if self.outage.active or OUTAGES.is_down(POSTGRES) or OUTAGES.is_down(REDIS):
                probe()  # an outage ends when both answer, not when a tick happens to need neither
            if now >= self._next_start:
                self._start_order()
                self._next_start = now + self.interval
            self._approve_due()
            if now >= self._next_purge:
                finished = WorkflowRun.objects.filter(id__in=self._for_bot, status__in=TERMINAL_STATUSES)
                self._for_bot -= {str(i) for i in finished.values_list("id", flat=True)}
                self._next_purge = now + 30
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            self.outage.failed(exc, now)
            return False
        self.outage.succeeded(now)
        return True

    def _start_order(self) -> None:
        redis_connection().ping()  # Redis away: wait for it rather than start runs no worker hears of
        if WorkflowRun.objects.filter(workflow_name=WORKFLOW, status=RunStatus.PENDING).count() >= BACKLOG_CAP:
            return  # the workers are behind (one was just killed, say): let them catch up
        n = self.started + 1
        if self._order is None:  # kept until started: a retry after a failure starts the same order
            self._order, self._faulted = make_order(n, self.batch, self._rng), False
        order = self._order
        fault = FAULTS.get(n % 10)
        if fault is not None and not self._faulted and self._fault_wanted(fault[0], fault[1]):
            inject(fault[0], fault[1], fault[2])
            self.injected[fault[3]] += 1
        self._faulted = True
        # Idempotent per business key: if an earlier attempt committed, this returns that run.
        run = start(WORKFLOW, order, business_key=order["id"], tenant=_TENANTS[n % len(_TENANTS)],
                    started_via="demo")
        self.started, self._order = n, None
        if n % 3 != 0 or ApprovalRequest.objects.filter(state__in=OPEN_APPROVAL_STATES).count() >= HUMAN_APPROVAL_CAP:
            self._for_bot.add(str(run.id))

    def _fault_wanted(self, provider: str, operation: str) -> bool:
        if ProviderFault.objects.filter(provider=provider, operation=operation, remaining__gt=0).exists():
            return False  # the last one has not hit yet: do not let them pile up
        if (provider, operation) == ("email", "send"):
            unknown = EffectRecord.objects.filter(
                connector="email.send", kind=EffectKind.EFFECT, status=EffectStatus.UNKNOWN
            ).count()
            return unknown < UNKNOWN_EMAIL_CAP
        return True

    def _approve_due(self) -> None:
        if not self._for_bot:
            return
        due = ApprovalRequest.objects.filter(
            run_id__in=self._for_bot, state=ApprovalState.PENDING,
            requested_at__lte=timezone.now() - timedelta(seconds=self.bot_delay),
        ).values_list("id", "run_id")
        for approval_id, run_id in due:
            if bot_approve(approval_id, self._bot):  # False: a person (or a cancellation) was quicker
                self.bot_approvals += 1
            self._for_bot.discard(str(run_id))
