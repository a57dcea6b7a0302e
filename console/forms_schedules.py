"""The schedules page's forms: pause, resume, trigger now, delete, and backfill a range.

Each says why (``reason``: it goes into the audit log); pause, resume and delete also say what the
person saw (``expected``: ``active`` or ``paused``), so a change made since, or the same form sent
twice, is refused (409). A backfill's range is two UTC times (``YYYY-MM-DD HH:MM``, or what a
``datetime-local`` field sends); a range the form cannot take is an error naming the field,
answered 400 before anything is attempted."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
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


class ScheduleCreateForm(ActionForm):
    """A new schedule: what ``sagas.schedule`` takes, as a form. The spec's own check
    (``ScheduleSpec.checked``) says what is wrong with it, naming the field."""

    name = text_field("Name", 200, required="Give the schedule a name.")
    workflow = text_field("Workflow", 200, required="Choose the workflow it starts.")
    cron = text_field("Cron expression", 200)
    timezone = text_field("Time zone", 64)
    every_seconds = text_field("Every (seconds)", 12)
    input = text_field("Input (JSON)", 100_000)
    tenant = text_field("Tenant", 100)
    business_key = text_field("Business key template", 200)
    jitter_seconds = text_field("Jitter (seconds)", 12)
    catch_up = text_field("Catch-up", 10)
    catch_up_window_seconds = text_field("Catch-up window (seconds)", 12)
    overlap = text_field("Overlap", 20)
    reason = text_field("Reason", MAX_TEXT_CHARS, required=REASON_REQUIRED)

    def clean(self) -> dict[str, Any]:
        from sagas.errors import InvalidArgument
        from sagas.integration import DEFAULT_BUSINESS_KEY, ScheduleSpec

        data = super().clean() or {}
        if self.errors:
            return data
        try:
            value = json.loads(data["input"]) if data.get("input", "").strip() else None
        except ValueError as exc:
            raise forms.ValidationError(f"Input (JSON): not JSON ({exc}).") from None
        spec = ScheduleSpec(
            name=data["name"].strip(), workflow=data["workflow"].strip(), cron=data.get("cron", "").strip(),
            timezone=data.get("timezone", "").strip() or "UTC",
            every=timedelta(seconds=_whole("Every (seconds)", data.get("every_seconds", ""), 1, 366 * 86400))
            if data.get("every_seconds", "").strip() else None,
            input=value, tenant=data.get("tenant", "").strip() or "default",
            business_key=data.get("business_key", "").strip() or DEFAULT_BUSINESS_KEY,
            jitter=timedelta(seconds=_whole("Jitter (seconds)", data.get("jitter_seconds", "") or "0", 0, 3600)),
            catch_up=data.get("catch_up", "") or "last",
            catch_up_window=timedelta(seconds=_whole("Catch-up window (seconds)",
                                                     data.get("catch_up_window_seconds", "") or "3600", 0,
                                                     31 * 86400)),
            overlap=data.get("overlap", "") or "skip",
        )
        try:
            data["spec"] = spec.checked()
        except InvalidArgument as exc:
            raise forms.ValidationError(f"{exc}.") from None
        return data


def _whole(label: str, text: str, low: int, high: int) -> int:
    text = text.strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise forms.ValidationError(f"{label}: “{text[:20]}” is not a whole number from {low} to {high}.")
    return int(text)
