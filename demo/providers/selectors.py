"""Reads on the providers' books: what really executed downstream, and how often."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet

from demo.models import ProviderExecution, ProviderReplay


def executions(provider: str, operation: str | None = None, key: str | None = None) -> QuerySet[ProviderExecution]:
    """Real executions, oldest first."""
    qs = ProviderExecution.objects.filter(provider=provider)
    if operation is not None:
        qs = qs.filter(operation=operation)
    if key is not None:
        qs = qs.filter(idempotency_key=key)
    return qs.order_by("id")


def replays(provider: str, operation: str | None = None, key: str | None = None) -> QuerySet[ProviderReplay]:
    """Requests answered from an earlier execution (deduplicated), oldest first."""
    qs = ProviderReplay.objects.filter(execution__provider=provider)
    if operation is not None:
        qs = qs.filter(execution__operation=operation)
    if key is not None:
        qs = qs.filter(execution__idempotency_key=key)
    return qs.order_by("id")


def duplicate_keys(provider: str, operation: str) -> QuerySet[Any, str]:
    """Non-blank idempotency keys executed more than once: each is a duplicate side effect."""
    return (
        ProviderExecution.objects.filter(provider=provider, operation=operation)
        .exclude(idempotency_key="")
        .values("idempotency_key")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .order_by("idempotency_key")
        .values_list("idempotency_key", flat=True)
    )
