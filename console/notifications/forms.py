"""The endpoint form and the secret's rotation (staff), and the deliveries page's query string."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.core.exceptions import ValidationError

from console.forms import CursorField, Problems, text_field
from console.notifications.models import NotificationFormat, NotificationKind

TENANT_RE = re.compile(r"^[^\x00-\x1f\x7f,]{1,100}$")


class EndpointForm(Problems, forms.Form):
    name = text_field("Name", 100, required="Give the endpoint a name.")
    url = text_field("URL", 500, required="Give the URL the notifications are POSTed to.")
    format = forms.ChoiceField(choices=NotificationFormat.choices, initial=NotificationFormat.GENERIC)
    kinds = forms.MultipleChoiceField(choices=NotificationKind.choices, required=False,
                                      widget=forms.CheckboxSelectMultiple)
    tenants = text_field("Tenants", 1000, help_text="comma-separated; empty: every tenant")
    active = forms.BooleanField(required=False, initial=True)

    def clean_url(self) -> str:
        url = self.cleaned_data["url"].strip()
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
        except ValueError:
            raise ValidationError("The URL is not a valid URL.") from None
        if parts.scheme not in ("http", "https"):
            raise ValidationError("The URL must start with http:// or https://.")
        if not parts.hostname:
            raise ValidationError("The URL has no host.")
        if parts.username is not None or parts.password is not None:
            raise ValidationError("The URL must not hold a user name or password; the endpoint's secret signs "
                                  "every body instead.")
        if any(ord(c) < 33 or ord(c) == 127 for c in url):
            raise ValidationError("The URL contains spaces or control characters.")
        return url

    def clean_tenants(self) -> list[str]:
        tenants = sorted({t.strip() for t in self.cleaned_data["tenants"].split(",") if t.strip()})
        bad = [t for t in tenants if not TENANT_RE.match(t)]
        if bad:
            raise ValidationError(f"Not a tenant name: {bad[0][:100]!r}.")
        return tenants

    def values(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {"name": d["name"].strip(), "url": d["url"], "format": d["format"], "kinds": list(d["kinds"]),
                "tenants": d["tenants"], "active": d["active"]}


class RotateForm(Problems, forms.Form):
    """How long the replaced secret goes on signing beside the new one (both are sent)."""

    keep_old_hours = forms.TypedChoiceField(
        label="Keep signing with the old secret too for", coerce=int, initial=0, required=False, empty_value=None,
        choices=[(0, "no time: stop now (a leaked secret)"), (1, "1 hour"), (24, "24 hours"), (168, "7 days")])


class DeliveriesForm(Problems, forms.Form):
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *NotificationKind.choices])
    after = CursorField(key=int)
