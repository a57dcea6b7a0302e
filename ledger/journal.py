"""The journal interface the ledger's protocol (``ledger.protocol``) is written against.

An effect is recorded twice: in the ledger's own table (``EffectRecord``: what is known
about the call downstream) and in the journal of whoever asked for it (where the call
sits in that caller's history, so that a replay finds it again). The journal belongs to
the caller: ``sagas.Context`` implements this interface for a workflow run, and the
ledger knows nothing of runs beyond the ``run_id`` it stores.

What a ``Journal`` promises the protocol (``ledger.protocol``):

* positions: ``replay_next`` returns the recorded entry at the caller's next position, or
  None past the end of what was recorded; a recorded entry of another kind or name stops
  the caller (its own error) rather than returning;
* durability and ownership: ``append`` writes an entry only while the caller still owns
  the journal (its fence), inside the current transaction if there is one, and
  ``check_fence`` holds that ownership for the rest of a transaction. Either raises a
  ``FenceLost`` once another owner took over, and nothing is written then;
* ``durably`` retries a commit that the database failed, while ownership lasts, without
  writing the entry twice;
* before anything happens for real, ``before_live`` may stop the caller (budgets, a
  shutdown), and ``before_retry`` may between two dispatches of the same record;
* ``crash_point`` may end the process at a named point (tests of failure windows);
* ``hold`` stops the caller while flow control (``ledger.flow``) holds a call back: the
  effect's record is PENDING with a ticket, and the caller comes back to it (a replay) once
  the ticket is let go. It never returns.

Errors the journal raises for its own reasons (a stop, a lost database) are
``BaseException``s of the caller's; the protocol lets them pass and never catches
them, except ``FenceLost`` when a provider's answer must still be kept as evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

if TYPE_CHECKING:
    from ledger.flow.gate import Hold

T = TypeVar("T")


class FenceLost(BaseException):
    """Raised by a ``Journal`` whose caller no longer owns it (another worker took the run
    over). Nothing was written. A ``BaseException``: no workflow code can swallow it."""

    code = "lease_lost"


@dataclass(frozen=True)
class EntryKinds:
    """The journal kinds the ledger writes for one kind of call."""

    intent: str  # intent recorded (commit 1): a position in the caller's order
    result: str  # outcome recorded (commit 2): looked up by name, not a position
    refused: str  # key reused with another payload: takes the intent's position


# The one definition of the journal kinds the ledger writes, by ``EffectRecord.kind``.
# Forward effects are positions in the workflow's own order (replayed); compensations are
# events around the run (never replayed). ``sagas.models.JournalKind`` re-uses these.
EFFECT_KINDS = EntryKinds(intent="effect_intent", result="effect_result", refused="effect_refused")
COMPENSATION_KINDS = EntryKinds(
    intent="compensation_intent", result="compensation_result", refused="compensation_refused"
)
KINDS: dict[str, EntryKinds] = {"effect": EFFECT_KINDS, "compensation": COMPENSATION_KINDS}


class Recorded(Protocol):
    """An entry as the journal recorded it."""

    @property
    def seq(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def payload(self) -> Any: ...


class Journal(Protocol):
    """What the ledger's protocol needs from the journal of whoever runs an effect."""

    @property
    def run_id(self) -> str:
        """Stored on each effect record; the default key is ``"{run_id}:{name}"``."""
        ...

    @property
    def tenant(self) -> str:
        """Keys are unique within a tenant."""
        ...

    def unique_name(self, name: str, space: str = "call") -> str:
        """``name`` for its first use, ``name#n`` for its n-th (deterministic on replay)."""
        ...

    def effect_key(self, name: str) -> str:
        """The idempotency key of effect ``name`` (already unique) when the code gives none:
        ``"{run_id}:{name}"``, or the key a run re-run from another one reuses (sagas.repair)."""
        ...

    def replay_next(self, kind: str, name: str, also: frozenset[str] = frozenset()) -> Recorded | None:
        """The recorded entry at the next position (of ``kind`` or one of ``also``, named
        ``name``), or None past the end of the recorded journal."""
        ...

    def recorded_event(self, kind: str, name: str) -> Recorded | None:
        """The entry ``kind``/``name`` that is not a position (an outcome), if recorded."""
        ...

    def before_live(self) -> None:
        """Called before an effect's intent is recorded for real; may raise to stop."""
        ...

    def before_retry(self) -> None:
        """Called between two dispatches of one record (it is PENDING again); may raise to stop."""
        ...

    def append(self, kind: str, name: str, payload: str, *, steps: int = 0, cost: float = 0.0) -> int:
        """Append an entry (``payload`` is its JSON text) under the caller's fence; its seq."""
        ...

    def check_fence(self) -> None:
        """Inside a transaction: hold the caller's ownership to its end, or raise ``FenceLost``."""
        ...

    def intent_recorded(self, effect: Any) -> None:
        """The ``EffectRecord`` just created with this journal's intent entry (same commit): the
        journal's owner may keep what it takes to record it again if the database loses both
        (``sagas.gaps``: a failover with asynchronous replication)."""
        ...

    def durably(self, write: Callable[[], T], *, kind: str, name: str, recorded: Callable[[int], T]) -> T:
        """``write()``, one commit that appends entry ``kind``/``name``, retried while the
        database is away and the caller owns the journal; ``recorded(seq)`` instead if a
        failed-looking commit turns out to have gone through."""
        ...

    def crash_point(self, point: str, name: str) -> None:
        """May end the process here (``before_intent``, ``after_intent``, ``after_dispatch``,
        ``after_outcome``), for tests of the windows between the protocol's steps."""
        ...

    def hold(self, hold: Hold) -> NoReturn:
        """Stop the caller: flow control holds this call back (``hold`` says why and where it
        stands). The caller's own ``BaseException``; the engine suspends the run."""
        ...
