"""Errors a provider answers with: an HTTP status and a message for ``{"error": ...}``."""

from __future__ import annotations


class ProviderError(Exception):
    """A refusal before any work was done. Nothing was executed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
