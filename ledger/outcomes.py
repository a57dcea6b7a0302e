"""What a connector's ``lookup(key)`` can say about an operation downstream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Outcome:
    """Base of lookup answers. Only ``Succeeded`` and ``NotExecuted`` are evidence."""

    conclusive = False


@dataclass(frozen=True)
class Succeeded(Outcome):
    result: dict[str, Any] = field(default_factory=dict)
    downstream_ref: str = ""
    conclusive = True


@dataclass(frozen=True)
class NotExecuted(Outcome):
    """The downstream system confirms it has no record of this key: safe to retry it."""

    conclusive = True


@dataclass(frozen=True)
class Pending(Outcome):
    """The downstream system has the operation but has not finished it."""


@dataclass(frozen=True)
class Unknown(Outcome):
    """The lookup itself could not tell (error, timeout, ambiguous answer)."""

    reason: str = ""
