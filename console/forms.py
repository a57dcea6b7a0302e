"""The console's input, validated with Django forms: one form per list page's query string, one
field type for the page cursor (``after``) of every keyset-paged list, and one form per action.

A list page builds its form from ``request.GET`` (or a live socket's params, which are the
page's query string), asks ``is_valid()`` and reads the selector's filters from the form. An
invalid filter is shown next to the form with what was typed, and the list is not queried
with it.

Every text field has a server-side cap (``MAX_TEXT_CHARS`` for what people write: reasons,
notes, comments; ``MAX_FILTER_CHARS`` or less for filters) and refuses NUL characters (Django's
``CharField`` does; PostgreSQL cannot store them), each with a message that names the field.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, cast

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from console.selectors.audit import AuditFilters
from operators.models import AuditOutcome
from operators.selectors.paging import BadCursor, Cursor, decode_cursor, encode_cursor
from operators.selectors.runs import RunFilters
from operators.selectors.search import search_problem
from sagas.models import RunStatus

MAX_FILTER_CHARS = 200
MAX_TEXT_CHARS = 4000  # a reason, a note (the evidence), a comment


def _messages(label: str) -> dict[str, str]:
    """Error messages that say which field is wrong (a page shows them without the form)."""
    return {
        "max_length": f"{label} is longer than %(limit_value)d characters (it has %(show_value)d); "
                      f"shorten it. Nothing was changed.",
        "null_characters_not_allowed": f"{label} contains a NUL character, which cannot be stored; remove it.",
    }


def text_field(label: str, max_length: int, *, required: str = "", **kwargs: Any) -> forms.CharField:
    """A capped free-text field that refuses NUL, with messages naming ``label``. ``required``:
    the message when it is left empty (none: it may be)."""
    messages = _messages(label) | ({"required": required} if required else {})
    return forms.CharField(required=bool(required), max_length=max_length, label=label, error_messages=messages,
                           **kwargs)


class Problems:
    """``problems()`` for any form: every error as a sentence for the page."""

    errors: Any

    def problems(self) -> list[str]:
        """Every error, as sentences for the page (empty when the form is valid)."""
        return [message for messages in self.errors.values() for message in messages]


class FilterParams:
    """A list form's filters (``PARAMS``) as typed, for refilling the form and building links."""

    PARAMS: tuple[str, ...]
    data: Any

    @property
    def values(self) -> dict[str, str]:
        """The filters as typed (stripped), to refill the form and carry into links."""
        return {key: str(self.data.get(key) or "").replace("\x00", "").strip() for key in self.PARAMS}

    def link_params(self, **extra: str | None) -> dict[str, str]:
        """The filters that are set, plus the ``extra`` ones that are (a page cursor)."""
        return {k: v for k, v in {**self.values, **extra}.items() if v}


class CursorField(forms.CharField):
    """A keyset page cursor (``operators.selectors.paging``); cleans to a ``Cursor`` or None.

    ``key``: the list's id type (``int`` or ``uuid.UUID``). ``forgiving``: a damaged cursor
    cleans to None (the first page) instead of being an error."""

    def __init__(self, *, key: type[int | uuid.UUID], forgiving: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.key, self.forgiving = key, forgiving

    def to_python(self, value: Any) -> Cursor | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return decode_cursor(text, key=self.key)
        except BadCursor as exc:
            if self.forgiving:
                return None
            raise ValidationError(str(exc), code="bad_cursor") from exc


class PageForm(Problems, forms.Form):
    """A list without filters: only its page cursor. Subclasses set ``after``."""

    after: forms.Field

    @property
    def cursor(self) -> Cursor | None:
        """The page cursor if it is valid (whatever the other fields), else None."""
        if not self.is_bound or self.has_error("after"):
            return None
        return self.cleaned_data.get("after")

    @property
    def cursor_text(self) -> str:
        """The cursor as it goes into links: the one given if it is valid, else ""."""
        cursor = self.cursor
        return encode_cursor(cursor.at, cursor.pk) if cursor else ""


class EffectsPageForm(PageForm):
    """The ambiguous-effects queue (effect ids)."""

    after = CursorField(key=int)


# --- the runs list -------------------------------------------------------------------------


def _quoted(text: str) -> str:
    return f"“{text[:80]}{'…' if len(text) > 80 else ''}”"


def _too_long(label: str) -> dict[str, str]:
    return {**_messages(label), "max_length": f"{label} is longer than {MAX_FILTER_CHARS} characters."}


def _looks_like_a_whole_run_id(text: str) -> bool:
    bare = text.replace("-", "")
    return len(bare) >= 32 and text.count("-") in (0, 4) and all(c.isalnum() for c in bare)


class RunFilterForm(FilterParams, PageForm):
    """The runs list's query string: ``q status workflow version tenant from to reason paused
    top_level parent`` and ``after``.

    ``from`` and ``to`` take a date (the whole day: its start for ``from``, the next day's start
    for ``to``) or a date and time, in the server's time zone unless they name one. A damaged
    cursor shows the first page with a note (``notes``), not an error; so does a search that
    looks like a run id but is not one (it is searched as part of a business key).
    """

    PARAMS = ("q", "status", "workflow", "version", "tenant", "from", "to", "reason", "paused", "top_level", "parent")

    q = forms.CharField(required=False, max_length=MAX_FILTER_CHARS, error_messages=_too_long("Search"))
    status = forms.CharField(required=False, max_length=40, error_messages=_messages("Status"))
    workflow = forms.CharField(required=False, max_length=MAX_FILTER_CHARS, error_messages=_too_long("Workflow"))
    version = forms.CharField(required=False, max_length=20, error_messages=_messages("Version"))
    tenant = forms.CharField(required=False, max_length=MAX_FILTER_CHARS, error_messages=_too_long("Tenant"))
    # Why the runs stopped or failed (``status_reason``; comma-separated: any of them). The
    # overview's queue lines link here with it, so each lists exactly what it counts.
    reason = forms.CharField(required=False, max_length=MAX_FILTER_CHARS, error_messages=_too_long("Reason"))
    # Only the runs held by an operator's pause (their own or their workflow's): ``paused=1``.
    paused = forms.CharField(required=False, max_length=5, error_messages=_messages("Paused"))
    # Child runs (sagas.children): only the runs no run started (``top_level=1``, the form's
    # checkbox), or only the children of one run (``parent=<its id>``, the link on its page).
    top_level = forms.CharField(required=False, max_length=5, error_messages=_messages("Top-level runs only"))
    parent = forms.CharField(required=False, max_length=60, error_messages=_messages("Parent run"))
    after = CursorField(key=uuid.UUID, forgiving=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "from" is a Python keyword: these two fields cannot be declared as attributes.
        self.fields["from"] = text_field("Created from", 40)
        self.fields["to"] = text_field("Created to", 40)
        self.notes: list[str] = []

    def clean_status(self) -> str:
        status = self.cleaned_data["status"]
        if status and status not in RunStatus.values:
            raise ValidationError(
                f"Status: {_quoted(status)} is not a run status; choose one of {', '.join(RunStatus.values)}.")
        return status

    def clean_paused(self) -> bool:
        text = self.cleaned_data["paused"].strip().lower()
        if text not in ("", "1", "yes", "true", "on"):
            raise ValidationError(f"Paused: {_quoted(text)} is not understood; use paused=1 or leave it out.")
        return bool(text)

    def clean_top_level(self) -> bool:
        text = self.cleaned_data["top_level"].strip().lower()
        if text not in ("", "1", "yes", "true", "on"):
            raise ValidationError(f"Top-level runs only: {_quoted(text)} is not understood; use top_level=1 or "
                                  f"leave it out.")
        return bool(text)

    def clean_parent(self) -> str:
        text = self.cleaned_data["parent"].strip()
        if not text:
            return ""
        try:
            return str(uuid.UUID(text))
        except ValueError:
            raise ValidationError(f"Parent run: {_quoted(text)} is not a run id; give the whole id of the parent "
                                  f"run (36 characters, as on its page).") from None

    def clean_version(self) -> int | None:
        return version_number(self.cleaned_data["version"])

    def _when(self, name: str, *, end: bool) -> datetime | None:
        text = self.cleaned_data[name]
        if not text:
            return None
        try:
            day = parse_date(text)
            if day is not None:
                start = timezone.make_aware(datetime.combine(day, datetime.min.time()))
                return start + timedelta(days=1) if end else start
            moment = parse_datetime(text)
        except ValueError:  # well formed but impossible, such as 2026-13-40
            moment = None
        except OverflowError:  # the day after 9999-12-31
            raise ValidationError(f"{self.fields[name].label}: {_quoted(text)} is out of range; "
                                  f"write a date before 9999-12-31.") from None
        if moment is None:
            raise ValidationError(f"{self.fields[name].label}: {_quoted(text)} is not a date or a time; "
                                  f"write 2026-11-29 or 2026-11-29T14:30.")
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment)

    def clean_from(self) -> datetime | None:
        return self._when("from", end=False)

    def clean_to(self) -> datetime | None:
        return self._when("to", end=True)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("version") is not None and not data.get("workflow"):
            self.add_error("version", "Version: choose a workflow too; version numbers belong to a workflow.")
        created_from, created_to = data.get("from"), data.get("to")
        if created_from and created_to and created_from >= created_to:
            raise ValidationError("Created from must be before created to.")
        search = data.get("q") or ""
        if data.get("top_level") and data.get("parent"):
            self.add_error("top_level", "Top-level runs only and Parent run cannot go together: a run's children "
                                        "are never top-level runs. Choose one.")
        if (problem := search_problem(search)) is not None:
            self.add_error("q", problem)
        elif search and _looks_like_a_whole_run_id(search):
            try:
                uuid.UUID(search)
            except ValueError:
                self.notes.append(f"{_quoted(search)} is not a valid run id; it is searched as part of a business key.")
        if str(self.data.get("after") or "").strip() and data.get("after") is None:
            self.notes.append("The page link was damaged (its cursor is not one this page makes); "
                              "showing the first page.")
        return data

    def filters(self) -> RunFilters:
        d = self.cleaned_data
        return RunFilters(status=d["status"], workflow=d["workflow"], version=d["version"], tenant=d["tenant"],
                          created_from=d["from"], created_to=d["to"], search=d["q"],
                          reasons=tuple(sorted({r.strip() for r in d["reason"].split(",") if r.strip()})),
                          paused=d["paused"], top_level=d["top_level"], parent=d["parent"])


# --- the audit log -------------------------------------------------------------------------


class AuditFilterForm(PageForm):
    """The audit log's query string: the filters (``FILTERS``) and ``after``."""

    FILTERS = ("actor", "action", "object_type", "object_id", "outcome", "since", "until")

    actor = text_field("Actor", 200)
    action = text_field("Action", 60)
    object_type = text_field("Object type", 60)
    object_id = text_field("Object id", 100)
    outcome = forms.ChoiceField(required=False, choices=[("", "any"), *AuditOutcome.choices])
    since = forms.DateTimeField(required=False, label="from (UTC)")
    until = forms.DateTimeField(required=False, label="before (UTC)")
    after = CursorField(key=int)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        since, until = data.get("since"), data.get("until")
        if since and until and since >= until:
            raise ValidationError("the start of the time range must be before its end")
        return data

    def filter_params(self) -> dict[str, str]:
        """The filters that are set, as given, to carry into pager and CSV links."""
        return {k: str(self.data[k]) for k in self.FILTERS if self.data.get(k)}

    def filters(self) -> AuditFilters:
        d = self.cleaned_data
        return AuditFilters(
            actor=d["actor"].strip(), action=d["action"].strip(), object_type=d["object_type"].strip(),
            object_id=d["object_id"].strip(), outcome=d["outcome"], since=d["since"], until=d["until"],
        )


# --- actions -------------------------------------------------------------------------------
#
# What a person writes is capped and must be storable; whether it is enough (a reason given, a
# note with evidence, the state seen) is the service's to say, so a refusal is audited there.


class ActionForm(Problems, forms.Form):
    """An action's form. ``expected``: the state the person saw (an empty one is the service's
    to refuse, audited)."""

    expected = text_field("The state you saw", 40)


def version_number(text: str) -> int | None:
    """A workflow version typed or chosen in a form: None for empty, else 1 to 2**31 - 1."""
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) < 2**31:
        raise ValidationError(f"Version: {_quoted(text)} is not a version number (1, 2, 3 …).")
    return int(text)


def posted_version(value: object) -> int | None:
    """The version of an action's form as the view hands it on: cleaned already (an int) for
    someone allowed to act, or as sent (a string, never called wrong) for someone the service
    will deny and audit."""
    if isinstance(value, int) or value is None:
        return value
    text = str(value)
    return int(text) if text.isdigit() and 0 < int(text) < 2**31 else None


class WorkflowPauseForm(ActionForm):
    """Pause or resume every run of a workflow (or of one version): a reason, the version ("" for
    every version) and the state seen (``running`` or ``paused``)."""

    workflow = text_field("Workflow", 200, required="The form did not say which workflow; reload the page.")
    reason = text_field("Reason", MAX_TEXT_CHARS, required="A reason is required; it goes into the audit log.")
    version = text_field("Version", 20)
    expected = text_field("The state you saw", 40,
                          required="The form did not say which state you saw; reload the page and try again.")

    field_order = ["workflow", "reason", "version", "expected"]

    def clean_version(self) -> int | None:
        return version_number(self.cleaned_data["version"])


class RunVersionForm(ActionForm):
    """Move or redrive a run: a reason, the status seen and a version (required to move; for a
    redrive, empty keeps the run's own)."""

    reason = text_field("Reason", MAX_TEXT_CHARS,
                        required="A reason is required; it goes into the audit log and the run's history.")
    expected = text_field("The status you saw", 40,
                          required="The form did not say which status you saw; reload the page and try again.")
    version = text_field("Version", 20)

    field_order = ["reason", "expected", "version"]

    def clean_version(self) -> int | None:
        return version_number(self.cleaned_data["version"])


class RunActionForm(ActionForm):
    """Cancel, retry or compensate a run: a reason is required (it goes into the audit log and the
    run's history), as is the status seen."""

    reason = text_field("Reason", MAX_TEXT_CHARS,
                        required="A reason is required; it goes into the audit log and the run's history.")
    expected = text_field("The status you saw", 40,
                          required="The form did not say which status you saw; reload the page and try again.")
    compensate = text_field("Compensate", 10)

    field_order = ["reason", "expected", "compensate"]


class EffectResolveForm(ActionForm):
    """Resolve an effect by hand: the outcome, the provider's reference and the evidence."""

    outcome = text_field("Outcome", 40)
    downstream_ref = text_field("Downstream reference", 300)
    note = text_field("Evidence", MAX_TEXT_CHARS, strip=False)
    after = text_field("Page", MAX_FILTER_CHARS)


class ApprovalDecideForm(ActionForm):
    """Approve (an optional comment) or reject: a rejection stops the run and compensates what it
    did, so it needs a reason (the comment) and the box ``confirm`` ticked, saying so."""

    REASON_REQUIRED = ("A reason is required to reject: it goes into the audit log and the run's history. "
                       "Nothing was changed.")
    CONFIRM_REQUIRED = ("Rejecting stops the run and compensates it (its completed effects are undone): tick "
                        "“I understand the run will be compensated” to confirm. Nothing was changed.")

    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")],
                                 error_messages={"required": "decision must be approve or reject",
                                                 "invalid_choice": "decision must be approve or reject"})
    comment = text_field("Comment", MAX_TEXT_CHARS)
    confirm = text_field("Confirmation", 20)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("decision") == "reject":
            if not (data.get("comment") or "").strip():
                self.add_error("comment", self.REASON_REQUIRED)
            if data.get("confirm") != "compensate":
                self.add_error("confirm", self.CONFIRM_REQUIRED)
        return data


class LoginForm(AuthenticationForm):
    """Django's login form with the username capped where the user table caps it (Django's form
    only sets the input's ``maxlength``): an overlong name is a failed login like any wrong one,
    not a 500 from recording the failure (django-axes keeps the name in 255 characters)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        username = cast(forms.CharField, self.fields["username"])  # AuthenticationForm's UsernameField
        username.validators.append(MaxLengthValidator(username.max_length or 150))
