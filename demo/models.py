"""Tables of the simulated downstream providers (payments, inventory, email, shipping).

They are the providers' own books, not the engine's: tests and the demo read
them to prove what really happened downstream. Invariant: one
``ProviderExecution`` row per real execution of a business action, committed
before the provider answers; a deduplicated replay is a ``ProviderReplay`` row,
never a second execution.
"""

from __future__ import annotations

from django.db import models


class ProviderExecution(models.Model):
    provider = models.CharField(max_length=20)
    operation = models.CharField(max_length=20)
    # The Idempotency-Key header as received. Recorded for every provider, also
    # those that ignore it (inventory, email), so duplicates can be counted.
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    request = models.JSONField(default=dict)
    response = models.JSONField(default=dict)
    status_code = models.PositiveSmallIntegerField()
    caller_pid = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["provider", "operation", "idempotency_key"], name="provider_exec_key"),
        ]

    def __str__(self) -> str:
        return f"{self.provider}.{self.operation} key={self.idempotency_key!r} [{self.status_code}]"


class ProviderReplay(models.Model):
    """A request a provider answered from an earlier execution with the same key."""

    execution = models.ForeignKey(ProviderExecution, on_delete=models.CASCADE, related_name="replays")
    caller_pid = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class ProviderFault(models.Model):
    """A fault the next ``remaining`` requests to (provider, operation) suffer.

    See ``demo.providers.faults`` for the fault names and what each one does.
    """

    provider = models.CharField(max_length=20)
    operation = models.CharField(max_length=20)
    fault = models.CharField(max_length=100)
    remaining = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["provider", "operation"], name="provider_fault_target")]

    def __str__(self) -> str:
        return f"{self.provider}.{self.operation}: {self.fault} x{self.remaining}"


class WebhookArrival(models.Model):
    """One POST that reached the demo's webhook receiver (``demo.providers.webhook``), committed
    before it was answered. Not deduplicated: two rows with one key are one notification sent twice."""

    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    delivery = models.CharField(max_length=50, blank=True, default="", help_text="X-Saga-Delivery")
    signature_ok = models.BooleanField()
    kind = models.CharField(max_length=30, blank=True, default="")
    summary = models.TextField(blank=True, default="")
    body = models.JSONField(default=dict)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["idempotency_key"], name="webhook_arrival_key")]

    def __str__(self) -> str:
        return f"arrival {self.id} key={self.idempotency_key!r} ok={self.signature_ok}"


class ProviderLimit(models.Model):
    """The provider's own rate limit on (provider, operation): at most ``per_second`` requests in
    any one-second window, counted as they arrive; a request over it is answered 429 with
    ``Retry-After`` and nothing is executed. ``refused`` counts those answers, and
    ``peak_in_flight`` the most requests it was serving at once (``demo.providers.limits``)."""

    provider = models.CharField(max_length=20)
    operation = models.CharField(max_length=20)
    per_second = models.PositiveIntegerField()
    refused = models.PositiveIntegerField(default=0)
    peak_in_flight = models.PositiveIntegerField(default=0, help_text="most requests being served at once")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "operation"], name="provider_limit_unique")]

    def __str__(self) -> str:
        return f"{self.provider}.{self.operation}: {self.per_second}/s ({self.refused} refused)"
