"""The schedules page's forms: pause, resume, trigger now, delete, and backfill a range.

Each says why (``reason``: it goes into the audit log); pause, resume and delete also say what the
person saw (``expected``: ``active`` or ``paused``), so a change made since, or the same form sent
twice, is refused (409). A backfill's range is two UTC times (``YYYY-MM-DD HH:MM``, or what a
``datetime-local`` field sends); a range the form cannot take is an error naming the field,
answered 400 before anything is attempted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms

from console.forms import MAX_TEXT_CHARS, ActionForm, text_field

REASON_REQUIRED = "A reason is required; it goes into the audit log."
EXPECTED_REQUIRED = "The form did not say which state you saw; reload the page and try again."
TIME_FORMATS = ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")


def utc_time(label: str, text: str) -> datetime:
    """A time typed in a form, read as UTC; ``ValidationError`` naming ``label`` otherwise."""
    for fmt in TIME_FORMATS:
        try:
            return datetime.strptime(text.strip(), fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise forms.ValidationError(f"{label}: “{text[:40]}” is not a time; write it as 2026-03-29 02:00 (UTC).")


class ScheduleStateForm(ActionForm):
    """Pause, resume or delete: a reason and the state seen."""

    reason = text_field("Reason", MAX_TEXT_CHARS, required=REASON_REQUIRED)
    expected = text_field("The state you saw", 40, required=EXPECTED_REQUIRED)


class ScheduleTriggerForm(ActionForm):
    """Fire one tick now: a reason."""

    reason = text_field("Reason", MAX_TEXT_CHARS, required=REASON_REQUIRED)


class ScheduleBackfillForm(ActionForm):
    """Fire the ticks of ``[start, end]`` (UTC) not handled yet: a reason besides the range."""

    start = text_field("From", 40, required="Say from when (UTC) to backfill.")
    end = text_field("To", 40, required="Say until when (UTC) to backfill.")
    reason = text_field("Reason", MAX_TEXT_CHARS, required=REASON_REQUIRED)

    def clean_start(self) -> datetime:
        return utc_time("From", self.cleaned_data["start"])

    def clean_end(self) -> datetime:
        return utc_time("To", self.cleaned_data["end"])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if isinstance(data.get("start"), datetime) and isinstance(data.get("end"), datetime) \
                and data["end"] < data["start"]:
            raise forms.ValidationError("The range ends before it starts.")
        return data
