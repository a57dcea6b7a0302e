"""Errors a provider answers with: an HTTP status and a message for ``{"error": ...}``."""

from __future__ import annotations


class ProviderError(Exception):
    """A refusal before any work was done. Nothing was executed."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
