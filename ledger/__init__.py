"""The side-effect ledger. Public API:

    from ledger import connector, Connector, Outcome, Unknown, NotExecuted, Succeeded, Pending
    from ledger import Retryable, Final, Timeout, KeyConflict, EffectFailed
"""

from __future__ import annotations

from ledger.connectors import Connector, connector
from ledger.errors import EffectFailed, Final, KeyConflict, Retryable, Timeout
from ledger.outcomes import NotExecuted, Outcome, Pending, Succeeded, Unknown

__all__ = [
    "connector", "Connector", "Outcome", "Unknown", "NotExecuted", "Succeeded", "Pending",
    "Retryable", "Final", "Timeout", "KeyConflict", "EffectFailed",
]
