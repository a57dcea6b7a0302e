"""Errors of the side-effect ledger, each with a stable ``code``.

Connectors raise the first three to say what happened downstream:

* ``Retryable``: known NOT executed (connection refused, 503 before work). Safe to
  retry with the same key, within the connector's policy. ``Throttled``, its kind for
  the provider's own rate limit (429), is retried without using up attempts.
* ``Final``: a definite, permanent refusal (validation, authorization). Never retried.
* ``Timeout``: no answer in time. The downstream system may have acted. So does
  any other exception raised after dispatch: the outcome is UNKNOWN.
"""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """Base of every ledger error; ``code`` is stable, ``as_dict()`` is what APIs show."""

    code = "ledger_error"

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self)}


class Retryable(LedgerError):
    """Raised by a connector: known NOT executed downstream; retried with the same key within its policy."""

    code = "retryable"


class Throttled(Retryable):
    """Raised by a connector: the provider refused the call for its own rate limit (HTTP 429),
    so it was NOT executed. Retried like ``Retryable``, after ``retry_after`` seconds when the
    provider says so, without using up the connector's attempts (the provider did not fail, it
    asked us to slow down); it counts towards the circuit breaker (``ledger.flow``)."""

    code = "throttled"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Final(LedgerError):
    """Raised by a connector: a permanent refusal (validation, authorization); never retried."""

    code = "final"


class Timeout(LedgerError):
    """Raised by a connector: no answer in time, the downstream may have acted; the outcome is UNKNOWN."""

    code = "timeout"


class ConnectorNotRegistered(LedgerError):
    code = "connector_not_registered"


class ConnectorAlreadyRegistered(LedgerError):
    """A second connector class was registered under a name another class already has. Raised
    at import, so at start-up: which one would win would depend on the order apps load in."""

    code = "connector_already_registered"


class KeyConflict(LedgerError):
    """The idempotency key was already used with a different payload. Nothing was executed."""

    code = "key_conflict"


class EffectFailed(LedgerError):
    """The effect failed permanently (FAILED_FINAL). Raised to the workflow, on replay too."""

    code = "effect_failed"

    def __init__(self, message: str, *, key: str = "", error_class: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.error_class = error_class


class OutcomeUnknown(LedgerError):
    """The effect's outcome is not known (UNKNOWN in the ledger): it may have happened
    downstream. Raised by ``ledger.protocol``; the caller decides what waits for it (the
    engine halts the run for reconciliation or a person). ``details``: effect_id, key,
    connector, step, error_class."""

    code = "outcome_unknown"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ReplayDiverged(LedgerError):
    """On replay, the code asks for another key or payload than the journal recorded at this
    position. Nothing was executed. ``recorded`` and ``asked`` say what differs."""

    code = "replay_diverged"

    def __init__(self, message: str, *, recorded: dict[str, Any], asked: dict[str, Any]) -> None:
        super().__init__(message)
        self.recorded = recorded
        self.asked = asked


class PayloadNotJSON(LedgerError):
    """An effect's payload is not JSON. Nothing was recorded or executed."""

    code = "payload_not_json"


class AlreadyResolved(LedgerError):
    """A resolution was attempted on an effect whose outcome is already known."""

    code = "already_resolved"


class InvalidResolution(LedgerError):
    """A resolution was refused before anything changed (no evidence, a bad outcome, a worker holds the run)."""

    code = "invalid_resolution"
