"""A run's history as a timeline: pages of journal entries newest first, each with the time since
the entry before it and, for the kinds that come in pairs, the entry it pairs with (an effect's
intent and its outcome, a compensation's, an approval's request and its decision).

Reads go through the journal's ``(run_id, seq)`` unique index: a page is one backward range scan
(plus, under a kind filter, the index entries of the kinds it skips), the time since the previous
entry costs nothing unfiltered (the page reads one row more) and one lookup by seq per row under
a filter, and the pairs cost one more read of the run's paired kinds with the names on the page,
only when the page shows such an entry. Seqs are gap-free from 1 to the newest
(``sagas.store.numbering``, ``sagas.selectors.run_newest_seq``), which the jump to a seq relies on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models.fields.json import KT
from django.utils import timezone

from ledger.models import EffectRecord
from operators.selectors.runs import HISTORY_PAGE_SIZE
from sagas.integration import CONTINUED_AS_NEW
from sagas.models import ApprovalRequest, JournalEntry, JournalKind

K = JournalKind

# The kind filter's groups, by the value the form sends; any single kind is a choice too.
KIND_GROUPS: dict[str, tuple[str, frozenset[str]]] = {
    "effects": ("effects (intents, outcomes, refusals, resolutions)",
                frozenset({K.EFFECT_INTENT, K.EFFECT_RESULT, K.EFFECT_REFUSED, K.EFFECT_RESOLVED})),
    "compensations": ("compensations", frozenset({
        K.COMPENSATION_STARTED, K.COMPENSATION_ITEM, K.COMPENSATION_INTENT, K.COMPENSATION_RESULT,
        K.COMPENSATION_REFUSED, K.COMPENSATION_FINISHED})),
    "approvals": ("approvals", frozenset({K.APPROVAL_REQUESTED, K.APPROVAL_DECIDED, K.APPROVAL_EXPIRED})),
    "waits": ("timers and signals", frozenset({
        K.TIMER_SET, K.TIMER_FIRED, K.SIGNAL_WAIT, K.SIGNAL_RECEIVED, K.SIGNAL_TIMEOUT, K.SUSPENDED,
        K.YIELDED, K.RESUMED})),
    "run": ("the run's life (start, claims, end, continued as new, operator actions)", frozenset({
        K.STARTED, K.CLAIMED, K.COMPLETED, K.FAILED, K.HALTED, K.CANCELLED, K.OPERATOR_ACTION,
        K.MOVED, K.REDRIVEN, K.FORKED, CONTINUED_AS_NEW})),
}

# An opening kind and the kinds that close it, entry for entry by name (a refusal takes an
# intent's place: it stands alone).
PAIRS: dict[str, frozenset[str]] = {
    K.EFFECT_INTENT: frozenset({K.EFFECT_RESULT, K.EFFECT_RESOLVED}),
    K.COMPENSATION_INTENT: frozenset({K.COMPENSATION_RESULT}),
    K.APPROVAL_REQUESTED: frozenset({K.APPROVAL_DECIDED, K.APPROVAL_EXPIRED}),
}
OPENER: dict[str, str] = {closer: opener for opener, closers in PAIRS.items() for closer in closers}
NOT_FINAL = frozenset({K.EFFECT_RESOLVED, K.APPROVAL_EXPIRED})  # another outcome may follow these
PAIR_WINDOW = 500  # entries either side of a page where the other halves of its pairs are looked for first
PAIRED_KINDS = frozenset(PAIRS) | frozenset(OPENER)
LEDGER_KIND: dict[str, str] = {K.EFFECT_INTENT: "effect", K.COMPENSATION_INTENT: "compensation"}


def kind_choices() -> list[tuple[str, Any]]:
    """The kind filter's options: every kind, all, and the groups above."""
    return [
        ("", "all kinds"),
        ("groups", [(value, label) for value, (label, _kinds) in KIND_GROUPS.items()]),
        ("one kind", [(kind, kind) for kind in sorted(K.values)]),
    ]


def kinds_for(value: str) -> frozenset[str]:
    """The kinds a filter value stands for (none: every kind)."""
    if not value:
        return frozenset()
    if value in KIND_GROUPS:
        return KIND_GROUPS[value][1]
    return frozenset({value})


@dataclass(frozen=True)
class Pair:
    """The other half of a paired entry. ``role``: this entry's, "intent" (the opener) or
    "outcome"; ``seq``: the other entry's (for an intent its newest outcome, None while it has
    none); ``status``: the outcome as a word (SUCCEEDED, FAILED_FINAL, APPROVED, ..., or for an
    intent without one the ledger's status, or PENDING); ``elapsed``: intent to outcome."""

    role: str
    seq: int | None
    status: str
    elapsed: timedelta | None
    on_page: bool = False

    @property
    def badge(self) -> str:
        """The status's badge class (its first word)."""
        return self.status.split(" ", 1)[0]


@dataclass(frozen=True)
class TimelineRow:
    """A journal entry as the timeline shows it."""

    run_id: Any
    seq: int
    kind: str
    name: str
    worker_id: str
    created_at: datetime
    payload: Any
    gap: timedelta | None  # since the entry before it (seq - 1); None for the first
    new_day: bool  # its date differs from the row above it (or it is the first row)
    pair: Pair | None


@dataclass(frozen=True)
class TimelinePage:
    """Rows newest first; ``next_before``: the seq to continue below (None: nothing older);
    ``newer``: whether entries newer than the page exist, ``newer_before`` the page above it
    (None with ``newer``: the first page)."""

    entries: list[TimelineRow]
    next_before: int | None
    newer: bool = False
    newer_before: int | None = None


def _outcome_status(kind: str, fields: dict[str, Any]) -> str:
    if kind in (K.EFFECT_RESULT, K.COMPENSATION_RESULT):
        return fields["st"] or "RECORDED"
    if kind == K.EFFECT_RESOLVED:
        return f"RESOLVED {fields['outcome'] or ''}".strip()
    if kind == K.APPROVAL_DECIDED:
        return "APPROVED" if fields["approved"] == "true" else "REJECTED"
    return "EXPIRED" if fields["on_timeout"] == "reject" else "ESCALATED"


def _paired_entries(run_id: Any, names: Iterable[str], kinds: Iterable[str], **seqs: int) -> list[dict[str, Any]]:
    """Entries of ``kinds`` named ``names`` in a seq range (``seq__gte=...`` and the like), with
    the payload fields their status is read from (never the whole payload)."""
    return list(
        JournalEntry.objects.filter(run_id=run_id, kind__in=sorted(kinds), name__in=sorted(names),
                                    **{f"seq__{op}": value for op, value in seqs.items()})
        .annotate(st=KT("payload__status"), outcome=KT("payload__outcome"), approved=KT("payload__approved"),
                  on_timeout=KT("payload__on_timeout"))
        .values("seq", "kind", "name", "created_at", "st", "outcome", "approved", "on_timeout")
    )


def _pairs(run_id: Any, rows: Sequence[JournalEntry]) -> dict[int, Pair]:
    """The pair of each paired entry in ``rows``, by seq.

    The other halves are looked for ``PAIR_WINDOW`` entries either side of the page first (a
    short range of the ``(run_id, seq)`` index, where nearly all of them are); only an intent
    with no outcome there, or with one that may be followed by another (an approval escalated,
    an effect resolved without an outcome), is looked up past the window towards the end of the
    run, and only an outcome with no intent there towards its start."""
    paired = [row for row in rows if row.kind in PAIRED_KINDS]
    if not paired:
        return {}
    low, high = min(row.seq for row in paired) - PAIR_WINDOW, max(row.seq for row in paired) + PAIR_WINDOW
    found = _paired_entries(run_id, {row.name for row in paired}, PAIRED_KINDS, gte=low, lte=high)
    final = {(OPENER[item["kind"]], item["name"]) for item in found
             if item["kind"] in OPENER and item["kind"] not in NOT_FINAL}
    openers_found = {(item["kind"], item["name"]) for item in found if item["kind"] in PAIRS}
    unsettled = {row.name for row in paired if row.kind in PAIRS and (row.kind, row.name) not in final}
    if unsettled:
        found += _paired_entries(run_id, unsettled, OPENER, gt=high)
    orphans = {row.name for row in paired if row.kind in OPENER and (OPENER[row.kind], row.name) not in openers_found}
    if orphans:
        found += _paired_entries(run_id, orphans, PAIRS, lt=low)
    found.sort(key=lambda item: item["seq"])
    openers: dict[tuple[str, str], dict[str, Any]] = {}
    last_outcome: dict[tuple[str, str], dict[str, Any]] = {}
    for item in found:
        if item["kind"] in PAIRS:
            openers[(item["kind"], item["name"])] = item
        else:
            last_outcome[(OPENER[item["kind"]], item["name"])] = item  # ascending: the newest wins
    by_seq = {item["seq"]: item for item in found}
    on_page = {row.seq for row in rows}
    waiting = [key for key in openers if key not in last_outcome]
    ledger = _open_statuses(run_id, waiting) if waiting else {}
    pairs: dict[int, Pair] = {}
    for row in rows:
        if row.kind in PAIRS:
            key = (row.kind, row.name)
            out = last_outcome.get(key)
            if out is None:
                pairs[row.seq] = Pair("intent", None, ledger.get(key, "PENDING"), None)
            else:
                pairs[row.seq] = Pair("intent", out["seq"], _outcome_status(out["kind"], out),
                                      out["created_at"] - row.created_at, out["seq"] in on_page)
        elif row.kind in OPENER:
            opener = openers.get((OPENER[row.kind], row.name))
            mine = by_seq[row.seq]
            pairs[row.seq] = Pair(
                "outcome", opener["seq"] if opener else None, _outcome_status(row.kind, mine),
                row.created_at - opener["created_at"] if opener else None,
                opener is not None and opener["seq"] in on_page,
            )
    return pairs


def _open_statuses(run_id: Any, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Where the journal has no outcome for an intent yet, the state of its row: the ledger's
    record for an effect or a compensation (UNKNOWN, IN_PROGRESS, ...), the approval request's
    for an approval (PENDING, ESCALATED, or EXPIRED when the run was cancelled)."""
    keys = list(keys)
    found: dict[tuple[str, str], str] = {}
    wanted = {(LEDGER_KIND[kind], name): kind for kind, name in keys if kind in LEDGER_KIND}
    if wanted:
        rows = EffectRecord.objects.filter(run_id=run_id, step_name__in=sorted({name for _k, name in wanted}))
        for kind, name, status in rows.values_list("kind", "step_name", "status"):
            if (kind, name) in wanted:
                found[(wanted[(kind, name)], name)] = status
    approvals = sorted(name for kind, name in keys if kind == K.APPROVAL_REQUESTED)
    if approvals:
        requests = ApprovalRequest.objects.filter(run_id=run_id, step__in=approvals)
        for step, state in requests.values_list("step", "state"):
            found[(K.APPROVAL_REQUESTED, step)] = state
    return found


def timeline_rows(run_id: Any, entries: Sequence[JournalEntry], *,
                  known: dict[int, datetime] | None = None) -> list[TimelineRow]:
    """``entries`` (newest first) as timeline rows. ``known``: times of entries already read
    (seq -> created_at), so that only the missing previous entries are looked up."""
    times = dict(known or {})
    times.update((e.seq, e.created_at) for e in entries)
    missing = sorted({e.seq - 1 for e in entries if e.seq > 1} - times.keys())
    if missing:
        times.update(JournalEntry.objects.filter(run_id=run_id, seq__in=missing).values_list("seq", "created_at"))
    pairs = _pairs(run_id, entries)
    rows: list[TimelineRow] = []
    above = None
    for e in entries:
        day = timezone.localtime(e.created_at).date()
        before = times.get(e.seq - 1)
        rows.append(TimelineRow(
            run_id=e.run_id, seq=e.seq, kind=e.kind, name=e.name, worker_id=e.worker_id,
            created_at=e.created_at, payload=e.payload, gap=e.created_at - before if before else None,
            new_day=day != above, pair=pairs.get(e.seq),
        ))
        above = day
    return rows


def history_timeline(run_id: Any, *, before: int | None = None, kinds: frozenset[str] = frozenset(),
                     size: int = HISTORY_PAGE_SIZE, newer: bool = False) -> TimelinePage:
    """The ``size`` newest entries with ``seq < before`` (of ``kinds``, if given), as rows.
    ``newer``: also find the page above this one (one more short range scan)."""
    qs = JournalEntry.objects.filter(run_id=run_id)
    if kinds:
        qs = qs.filter(kind__in=sorted(kinds))
    page_qs = qs.filter(seq__lt=before) if before is not None else qs
    rows = list(page_qs.order_by("-seq")[: size + 1])
    more = len(rows) > size
    shown = rows[:size]
    known = {e.seq: e.created_at for e in rows}
    page = TimelinePage(entries=timeline_rows(run_id, shown, known=known),
                        next_before=shown[-1].seq if more and shown else None)
    if not newer or before is None:
        return page
    above = list(qs.filter(seq__gte=before).order_by("seq").values_list("seq", flat=True)[: size + 1])
    if not above:
        return page
    return TimelinePage(entries=page.entries, next_before=page.next_before, newer=True,
                        newer_before=above[size - 1] + 1 if len(above) > size else None)


def history_jump_before(last_seq: int, seq: int, *, size: int = HISTORY_PAGE_SIZE) -> int | None:
    """The ``before`` of the unfiltered page that shows entry ``seq``, on the pages the first page's
    "older" links lead to (None: the first page). ``seq`` must be from 1 to ``last_seq``."""
    before = last_seq + 1 - ((last_seq - seq) // size) * size
    return None if before > last_seq else before
