"""The ambiguous-effects queue's query string: its filters, its search and its page cursor.

Like every list form (console/forms.py): a bad value is an error that names the field, shown
next to the filters with what was typed, and the list is not queried with it (a 400).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django import forms
from django.core.exceptions import ValidationError

from console.forms import MAX_FILTER_CHARS, EffectsPageForm, FilterParams, text_field
from operators.selectors.queues import EffectFilters
from operators.selectors.search import search_problem

# "Older than": how long the outcome has been unknown (since the last dispatch).
AGES: dict[str, tuple[str, timedelta]] = {
    "5m": ("older than 5 minutes", timedelta(minutes=5)),
    "1h": ("older than 1 hour", timedelta(hours=1)),
    "1d": ("older than 1 day", timedelta(days=1)),
    "7d": ("older than 7 days", timedelta(days=7)),
}
MAX_CARRIED_CHARS = 2000  # the filters an action carries back to the page (``filters`` field)


class EffectFilterForm(FilterParams, EffectsPageForm):
    """``q connector workflow tenant age`` and ``after``. ``q``: a business key substring (or its
    start, ending in ``*``) or a run id (or its first hex digits), as on the runs list."""

    PARAMS = ("q", "connector", "workflow", "tenant", "age")

    q = text_field("Search", MAX_FILTER_CHARS)
    connector = text_field("Connector", MAX_FILTER_CHARS)
    workflow = text_field("Workflow", MAX_FILTER_CHARS)
    tenant = text_field("Tenant", 100)
    age = forms.CharField(required=False, max_length=10, label="Unknown for",
                          error_messages={"max_length": "Unknown for: choose one of the listed ages."})

    field_order = ["q", "connector", "workflow", "tenant", "age", "after"]

    @classmethod
    def carried(cls, text: str, *, after: str = "") -> EffectFilterForm:
        """The form for the filters an action POST carried back (``filters``: a query string, as
        ``filter_query`` wrote it); a damaged or oversized one is no filter."""
        try:
            pairs = [] if len(text or "") > MAX_CARRIED_CHARS else parse_qsl(text or "", max_num_fields=20)
        except ValueError:  # more fields than a filter has
            pairs = []
        form = cls({**{k: v for k, v in pairs if k in cls.PARAMS}, "after": after})
        return form if form.filters_valid else cls({"after": after})

    @property
    def filters_valid(self) -> bool:
        """Whether every filter is valid (the cursor aside: a damaged one is the first page)."""
        return self.is_bound and not any(self.has_error(name) for name in self.PARAMS) and not self.non_field_errors()

    @property
    def filter_query(self) -> str:
        """The filters (not the cursor) as a query string: links and the actions' ``filters`` field."""
        return urlencode(self.link_params()) if self.filters_valid else ""

    @property
    def ages(self) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in AGES.items()]

    def clean_age(self) -> timedelta | None:
        text = self.cleaned_data["age"].strip()
        if not text:
            return None
        if text not in AGES:
            raise ValidationError(f"Unknown for: “{text[:20]}” is not one of "
                                  f"{', '.join(AGES)} (5 minutes, 1 hour, 1 day, 7 days).")
        return AGES[text][1]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        for name in ("q", "connector", "workflow", "tenant"):
            if name in data:
                data[name] = data[name].strip()
        if (problem := search_problem(data.get("q") or "")) is not None:
            self.add_error("q", problem)
        return data

    def filters(self) -> EffectFilters:
        """The selector's filters; only when ``filters_valid``."""
        d = self.cleaned_data
        return EffectFilters(connector=d["connector"], workflow=d["workflow"], tenant=d["tenant"],
                             older_than=d["age"], search=d["q"])
