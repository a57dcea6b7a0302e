"""The signing secret of a webhook, out (a notification endpoint) or in (a hook), and its
rotation: which scheme it signs with, and the secret it replaced while an overlap lasts.

A rotation always issues a Standard Webhooks secret. With an overlap, the replaced secret (and its
scheme: a legacy one too) stays in use until ``previous_until``: outbound bodies are signed with
both, inbound deliveries signed with either are accepted, so the other side can switch when it
deploys instead of at the same second. A second rotation within the overlap drops the oldest.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.utils import timezone

from core.webhooks import SignatureScheme, new_secret


class WebhookSecret(models.Model):
    """Abstract: the concrete model declares ``secret`` (in clear: an HMAC needs it)."""

    secret: str
    signature_scheme = models.CharField(
        max_length=10, choices=SignatureScheme.choices, default=SignatureScheme.STANDARD,
        help_text="how ``secret`` signs: rows made before Standard Webhooks keep the legacy scheme until rotated")
    previous_secret = models.CharField(max_length=200, blank=True, default="",
                                       help_text="the secret the last rotation replaced, in use until previous_until")
    previous_scheme = models.CharField(max_length=10, choices=SignatureScheme.choices, blank=True, default="")
    previous_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def is_legacy(self) -> bool:
        return self.signature_scheme == SignatureScheme.LEGACY

    def overlap_until(self, now: datetime | None = None) -> datetime | None:
        """When the previous secret stops being used; None when none is in use now."""
        now = now or timezone.now()
        if self.previous_secret and self.previous_until is not None and self.previous_until > now:
            return self.previous_until
        return None

    def secrets_in_use(self, scheme: str, now: datetime | None = None) -> list[str]:
        """The secrets of ``scheme`` that sign (out) or are accepted (in) now: the current one first."""
        found = [self.secret] if self.signature_scheme == scheme else []
        if self.previous_scheme == scheme and self.overlap_until(now) is not None:
            found.append(self.previous_secret)
        return found

    def rotate_secret(self, *, keep_old: timedelta, now: datetime | None = None) -> str:
        """Set a new Standard Webhooks secret (not saved) and return it; the current one stays in
        use for ``keep_old`` (none when zero)."""
        now = now or timezone.now()
        if keep_old > timedelta(0):
            self.previous_secret, self.previous_scheme = self.secret, self.signature_scheme
            self.previous_until = now + keep_old
        else:
            self.previous_secret, self.previous_scheme, self.previous_until = "", "", None
        self.secret, self.signature_scheme = new_secret(), SignatureScheme.STANDARD
        return self.secret
