"""How journal entries get their ``seq``, and how a run's counters catch up with its journal.

A lease holder's step writes one row, its journal entry, and leaves the run's row alone:
updating the wide, many-indexed run row at every step cost about a third of the step's
statement (bench/README.md, "A step writes one row"). So:

* **Numbering.** Every writer numbers its entry ``NEXT_SEQ``: the newest seq its statement
  sees, plus one. The unique ``(run_id, seq)`` index decides between two writers that saw the
  same newest entry: PostgreSQL makes the second wait for the first and then fail on
  ``journal_unique_run_seq``, and ``numbered()`` runs it again on a fresh snapshot, where it
  sees the winner's entry. Committed seqs therefore stay gap-free (a writer that aborts
  leaves no number behind), and a writer whose entry commits at ``n`` saw every entry below
  ``n``. A worker whose run was claimed meanwhile loses against the claim's own entry and, on
  its retry, sees the new fence and writes nothing (``LeaseLost``).
* **Counting.** The run's ``last_seq`` means "``steps_used`` and ``cost_used`` count the
  journal up to here". Steps past it are a lease holder's, not yet counted.
  ``COUNTED_TO_NEWEST`` and ``COUNTED_AND_NEXT`` are the SET clauses that count them (step
  and effect-intent entries, and the ``cost`` in step and effect-result payloads) and move
  ``last_seq`` on;
  the claim, every lease renewal, the finish, the suspend and every event writer use one. The
  subquery is correlated with the row, so when one of those statements waited for another
  writer's lock, PostgreSQL's re-check counts from the row's new ``last_seq``: nothing is
  counted twice.
* So on a run that no worker holds, ``last_seq`` is its newest entry; on a RUNNING or
  COMPENSATING run the newest entry is ``max(seq)`` (``WorkflowRun.entry_count``), and the
  counters trail by at most one lease renewal.

Inside a caller's transaction a lease holder's append first holds the run's row FOR SHARE
(``systemdb.check_fence``): claims and event writers wait for that transaction, so it never
loses a race on a seq (a lost race would abort the caller's transaction).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import IntegrityError, connection, transaction

T = TypeVar("T")

UNIQUE_SEQ = "journal_unique_run_seq"
# Tries before a writer gives up: each lost race means another entry committed, so a writer
# loses again only while others keep appending to the same run at that very moment.
ATTEMPTS = 8

# The newest seq this statement sees for the run ``r``, plus one (an index probe).
NEXT_SEQ = "(SELECT coalesce(max(j.seq), 0) + 1 FROM sagas_journalentry j WHERE j.run_id = r.id)"

# Kinds that count as one step against the run's budget (the ones that pass ``steps=1``).
_STEP_KINDS = "('step', 'effect_intent')"
# Entries whose payload may carry a ``cost``: a step's (``ctx.add_cost``), a call's outcome
# (``Connector.cost``) and a join of child runs whose spend the parent's budget covers (sagas.children).
_COST_KINDS = "('step', 'effect_result', 'children_joined')"


def _counted(new_last_seq: str) -> str:
    """The SET clause that counts the entries past the row's ``last_seq`` into ``steps_used``
    and ``cost_used`` and moves ``last_seq`` to ``new_last_seq`` (an SQL expression over the
    entries past ``last_seq``, ``j``). The table being updated must be aliased ``r``."""
    return f"""(steps_used, cost_used, last_seq) = (
        SELECT r.steps_used + count(*) FILTER (WHERE j.kind IN {_STEP_KINDS}),
               r.cost_used + coalesce(sum((j.payload ->> 'cost')::numeric) FILTER (WHERE j.kind IN {_COST_KINDS}), 0),
               {new_last_seq}
          FROM sagas_journalentry j
         WHERE j.run_id = r.id AND j.seq > r.last_seq)"""


# Count up to the newest visible entry (renewals): ``last_seq`` never moves back.
COUNTED_TO_NEWEST = _counted("coalesce(max(j.seq), r.last_seq)")
# Count everything and number one new entry after the newest (claims, finishes, events).
COUNTED_AND_NEXT = _counted("coalesce(max(j.seq), r.last_seq) + 1")


def is_seq_conflict(exc: BaseException) -> bool:
    """True for the unique ``(run_id, seq)`` violation: another writer took the seq."""
    if not isinstance(exc, IntegrityError):
        return False
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == UNIQUE_SEQ


def numbered(write: Callable[[], T]) -> T:
    """``write()``, again on a fresh snapshot each time another writer took its seq.

    Inside a transaction each attempt runs in a savepoint, so a lost race leaves the
    caller's transaction usable. Raises the last ``IntegrityError`` after ``ATTEMPTS``.
    """
    for attempt in range(ATTEMPTS):
        try:
            if connection.in_atomic_block:
                with transaction.atomic():
                    return write()
            return write()
        except IntegrityError as exc:
            if not is_seq_conflict(exc) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
