"""What a schedule says, checked, and the ticks it gives.

A tick is an instant (UTC in the database). A cron schedule's ticks are those of its expression in
its time zone, as ``cronsim`` computes them, which follows Debian's cron across daylight-saving
changes:

* clocks going forward (Europe/Berlin 02:00 -> 03:00 on the last Sunday of March): a time of day
  that does not exist that night (``30 2 * * *``) fires once, at the moment the clocks jump
  (03:00 local); an expression with a wildcard hour (``0 * * * *``) has no tick in the hour
  that is skipped;
* clocks going back (Europe/Berlin 03:00 -> 02:00 on the last Sunday of October): a fixed time
  in the repeated hour (``30 2 * * *``) fires once, the first time; a wildcard hour fires in
  both (02:00 summer time and 02:00 winter time, an hour apart).

An interval schedule's ticks are the multiples of its interval since 1970-01-01 00:00 UTC (every
15 minutes: :00, :15, :30, :45), so every process computes the same ticks with no shared state,
and daylight-saving changes do not move them.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from sagas.errors import InvalidArgument

CATCH_UP_CHOICES = ("all", "last", "none")
OVERLAP_CHOICES = ("skip", "buffer_one", "allow_all", "cancel_previous")
DEFAULT_BUSINESS_KEY = "{schedule}@{fire_time_utc}"
TEMPLATE_FIELDS = frozenset({"schedule", "fire_time", "fire_time_utc"})
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_NAME = 200
NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")
MAX_JITTER = timedelta(hours=1)
MAX_CATCH_UP_WINDOW = timedelta(days=31)


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule as written in code (``@workflow(..., schedules=[schedule(...)])``) or given
    to ``create_schedule``: exactly one of ``cron`` and ``every``.

    * ``name``: unique across schedules, what the console and the API call it: 1-200 letters,
      digits and ``. _ : -``;
    * ``cron`` with ``timezone`` (an IANA name, default UTC), or ``every`` (a ``timedelta`` of at
      least one second);
    * ``input``, ``tenant``: of each run started;
    * ``business_key``: a template of each run's business key, with ``{schedule}``,
      ``{fire_time}`` (the tick in the schedule's time zone, a ``datetime``, so
      ``{fire_time:%Y-%m-%d}`` works) and ``{fire_time_utc}`` (ISO 8601); two ticks must give two
      keys. The run's business key makes the start idempotent: a tick started twice is one run;
    * ``jitter``: each tick fires up to this much later (0 to 1 hour; the same delay for the same
      tick in every process), to spread schedules that share a tick;
    * ``catch_up`` and ``catch_up_window``: what to do with ticks that were missed (nothing fired
      them when due, because no sweeper ran): ``all`` fires each one within the window, oldest
      first; ``last`` only the newest; ``none`` none of them. Ticks older than the window are
      never fired. A tick is missed once it is more than the grace (``SAGAS_SCHEDULE_GRACE``)
      past its due time;
    * ``overlap``: when a tick comes while the run of the previous tick is still going:
      ``skip`` it; ``buffer_one`` (start it when that run finishes; a further tick meanwhile is
      skipped); ``allow_all`` (start it anyway); ``cancel_previous`` (cancel that run, without
      compensating it, then start).
    """

    name: str
    workflow: str = ""
    cron: str = ""
    timezone: str = "UTC"
    every: timedelta | None = None
    input: Any = None
    tenant: str = "default"
    business_key: str = DEFAULT_BUSINESS_KEY
    jitter: timedelta = timedelta(0)
    catch_up: str = "last"
    catch_up_window: timedelta = timedelta(hours=1)
    overlap: str = "skip"

    def checked(self) -> ScheduleSpec:
        """This spec if it is well formed; ``InvalidArgument`` naming what is not."""
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise InvalidArgument(f"a schedule's name is 1-{MAX_NAME} letters, digits and . _ : - "
                                  f"(it goes into URLs), not {self.name!r}")
        if self.workflow:  # "" in schedule(...) until @workflow fills it in
            _text("workflow", self.workflow, 200)
        _text("tenant", self.tenant, 100)
        if bool(self.cron) == (self.every is not None):
            raise InvalidArgument(f"schedule {self.name!r}: give exactly one of cron and every")
        zone = timezone_check(self.timezone)
        if self.cron:
            cron_check(self.cron)
        else:
            if not isinstance(self.every, timedelta) or self.every < timedelta(seconds=1):
                raise InvalidArgument(f"schedule {self.name!r}: every must be a timedelta of at least one second")
            if self.every.microseconds:
                raise InvalidArgument(f"schedule {self.name!r}: every must be a whole number of seconds")
        if not isinstance(self.jitter, timedelta) or not timedelta(0) <= self.jitter <= MAX_JITTER:
            raise InvalidArgument(f"schedule {self.name!r}: jitter must be a timedelta from 0 to 1 hour")
        if self.catch_up not in CATCH_UP_CHOICES:
            raise InvalidArgument(f"schedule {self.name!r}: catch_up must be one of {', '.join(CATCH_UP_CHOICES)}")
        if (not isinstance(self.catch_up_window, timedelta)
                or not timedelta(0) <= self.catch_up_window <= MAX_CATCH_UP_WINDOW):
            raise InvalidArgument(f"schedule {self.name!r}: catch_up_window must be a timedelta from 0 to 31 days")
        if self.overlap not in OVERLAP_CHOICES:
            raise InvalidArgument(f"schedule {self.name!r}: overlap must be one of {', '.join(OVERLAP_CHOICES)}")
        template_check(self.name, self.business_key, self, zone)
        return self


def _text(what: str, value: Any, longest: int) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= longest or any(ord(c) < 32 for c in value):
        raise InvalidArgument(f"schedule {what} must be 1-{longest} characters with no control characters")


def timezone_check(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidArgument(f"unknown time zone {name!r} (an IANA name, such as Europe/Berlin)") from None


def cron_check(expression: str) -> None:
    if not isinstance(expression, str) or len(expression) > 200:
        raise InvalidArgument("a cron expression is a string of at most 200 characters")
    if len(expression.split()) != 5:  # cronsim also takes a sixth (seconds): ticks are minutes here
        raise InvalidArgument(f"cron expression {expression!r}: give five fields (minute hour day month weekday)")
    try:
        CronSim(expression, datetime(2026, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise InvalidArgument(f"cron expression {expression!r}: {exc}") from None


def template_check(name: str, template: str, spec: ScheduleSpec, zone: ZoneInfo) -> None:
    if not isinstance(template, str) or not 1 <= len(template) <= 200:
        raise InvalidArgument(f"schedule {name!r}: the business key template must be 1-200 characters")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise InvalidArgument(f"schedule {name!r}: business key template {template!r}: {exc}") from None
    unknown = {f.split(".")[0].split("[")[0] for f in fields} - TEMPLATE_FIELDS
    if unknown:
        raise InvalidArgument(
            f"schedule {name!r}: business key template {template!r} names {', '.join(sorted(unknown))}; "
            f"it may use {{schedule}}, {{fire_time}} and {{fire_time_utc}}")
    first = next(ticks_after(spec, EPOCH + timedelta(days=20_000), zone=zone))
    second = next(ticks_after(spec, first, zone=zone))
    try:
        one, two = business_key(spec, first, zone=zone), business_key(spec, second, zone=zone)
    except (ValueError, KeyError, AttributeError, IndexError) as exc:
        raise InvalidArgument(f"schedule {name!r}: business key template {template!r}: {exc}") from None
    if one == two:
        raise InvalidArgument(
            f"schedule {name!r}: business key template {template!r} gives two ticks the same key ({one!r}); "
            f"put more of {{fire_time}} in it")
    if len(one) > 200 or any(ord(c) < 32 for c in one):
        raise InvalidArgument(f"schedule {name!r}: business key template {template!r} gives a key over "
                              f"200 characters or with a control character")


def business_key(spec: ScheduleSpec, tick: datetime, *, zone: ZoneInfo | None = None) -> str:
    """The business key of the run of ``tick``."""
    zone = zone or ZoneInfo(spec.timezone)
    return spec.business_key.format(schedule=spec.name, fire_time=tick.astimezone(zone),
                                    fire_time_utc=tick.astimezone(UTC).isoformat())


def ticks_after(spec: ScheduleSpec, after: datetime, *, zone: ZoneInfo | None = None) -> Iterator[datetime]:
    """The schedule's ticks strictly after ``after``, in order, as UTC datetimes (endless but for
    a cron expression with no tick in 50 years)."""
    if spec.every is not None:
        step = spec.every
        n = (after - EPOCH) // step + 1
        while True:
            yield EPOCH + n * step
            n += 1
    zone = zone or ZoneInfo(spec.timezone)
    for tick in CronSim(spec.cron, after.astimezone(zone)):
        yield tick.astimezone(UTC)


def ticks_between(spec: ScheduleSpec, start: datetime, end: datetime, *, limit: int) -> list[datetime]:
    """The ticks in ``[start, end]``, at most ``limit`` of them."""
    out: list[datetime] = []
    for tick in ticks_after(spec, start - timedelta(microseconds=1)):
        if tick > end or len(out) >= limit:
            break
        out.append(tick)
    return out


def jitter_of(name: str, tick: datetime, jitter: timedelta) -> timedelta:
    """How much later than ``tick`` it fires: from 0 to ``jitter``, the same in every process."""
    if not jitter:
        return timedelta(0)
    digest = hashlib.sha256(f"{name}@{tick.astimezone(UTC).isoformat()}".encode()).digest()
    micros = int(jitter / timedelta(microseconds=1))
    return timedelta(microseconds=int.from_bytes(digest[:8], "big") % (micros + 1))
