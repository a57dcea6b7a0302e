"""The connectors page's action forms: pause or resume a connector, change its limits, and set
or remove a tenant's daily spend limit on one.

Each says which connector (``connector``), why (``reason``, required) and what the person saw
(``expected``: ``running`` or ``paused``; for the limits also the limits' version the page
showed, so a change made since, or the same form sent twice, is refused). A value that cannot be
a limit is an error naming the field, answered 400 before anything is attempted; the ranges are
``ledger.flow.services.Limits.checked``'s (and ``spend_per_day``'s for a spend limit), so the
page and the core never disagree on them.
"""

from __future__ import annotations

from typing import Any

from django import forms

from console.forms import MAX_TEXT_CHARS, ActionForm, text_field
from ledger.flow.services import (
    KEY_FIELD_CHARS,
    SPEND_CONNECTOR_CHARS,
    SPEND_TENANT_CHARS,
    InvalidFlowSetting,
    Limits,
    spend_per_day,
)

CONNECTOR_REQUIRED = "The form did not say which connector; reload the page."
EXPECTED_REQUIRED = "The form did not say which state you saw; reload the page and try again."


class ConnectorPauseForm(ActionForm):
    """Pause (a reason is required: it goes into the audit log and the page shows it) or resume."""

    connector = text_field("Connector", 200, required=CONNECTOR_REQUIRED)
    reason = text_field("Reason", MAX_TEXT_CHARS, required="A reason is required; it goes into the audit log.")
    expected = text_field("The state you saw", 40, required=EXPECTED_REQUIRED)

    field_order = ["connector", "reason", "expected"]


def _number(label: str, *, whole: bool, required: bool) -> forms.Field:
    """A number field whose every error names ``label`` (a page shows them without the form)."""
    kind = "a whole number (1, 2, 3 …)" if whole else "a number (such as 5 or 0.5)"
    messages = {"invalid": f"{label} must be {kind}; nothing was changed.",
                "required": f"{label} is required; nothing was changed."}
    field: forms.Field
    if whole:
        field = forms.IntegerField(required=required, label=label, error_messages=messages)
    else:
        field = forms.FloatField(required=required, label=label, error_messages=messages)
    return field


class ConnectorLimitsForm(ActionForm):
    """New limits for a connector (``declared`` set: back to the defaults its class declares, and
    the numbers are not read). An empty rate or calls-in-flight means no such limit."""

    connector = text_field("Connector", 200, required=CONNECTOR_REQUIRED)
    reason = text_field("Reason", MAX_TEXT_CHARS, required="A reason is required; it goes into the audit log.")
    expected = text_field("The state you saw", 60, required=EXPECTED_REQUIRED)
    declared = forms.BooleanField(required=False)
    rate = _number("Rate (calls per second)", whole=False, required=False)
    burst = _number("Burst", whole=True, required=False)
    max_in_flight = _number("Calls in flight", whole=True, required=False)
    key_field = text_field("Limit key", KEY_FIELD_CHARS)
    circuit_failures = _number("Failures that open the circuit", whole=True, required=False)
    circuit_window_seconds = _number("Circuit window (seconds)", whole=False, required=False)
    circuit_cooldown_seconds = _number("Circuit cool-down (seconds)", whole=False, required=False)

    field_order = ["connector", "reason", "expected", "declared", "rate", "burst", "max_in_flight", "key_field",
                   "circuit_failures", "circuit_window_seconds", "circuit_cooldown_seconds"]

    REQUIRED_UNLESS_DECLARED = ("burst", "circuit_failures", "circuit_window_seconds", "circuit_cooldown_seconds")

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("declared") or self.errors:
            data["limits"] = None
            return data
        for name in self.REQUIRED_UNLESS_DECLARED:
            if data.get(name) is None:
                self.add_error(name, f"{self.fields[name].label} is required; nothing was changed.")
        if self.errors:
            return data
        try:
            data["limits"] = Limits(
                rate=data["rate"], burst=data["burst"], max_in_flight=data["max_in_flight"],
                key_field=data.get("key_field") or "", circuit_failures=data["circuit_failures"],
                circuit_window_seconds=data["circuit_window_seconds"],
                circuit_cooldown_seconds=data["circuit_cooldown_seconds"]).checked()
        except InvalidFlowSetting as exc:
            raise forms.ValidationError(f"{str(exc)[:1].upper()}{str(exc)[1:]}; nothing was changed.") from exc
        return data


PER_DAY_LABEL = "Daily limit (usd)"


class SpendLimitForm(ActionForm):
    """Set, raise or lower a tenant's daily spend limit on a connector (``tenant`` ``*``: every
    tenant without its own), or remove it (``remove`` set: the amount is not read). ``expected``:
    the limit the page showed (its amount, or ``none`` for a new one)."""

    tenant = text_field("Tenant", SPEND_TENANT_CHARS,
                        required="Say which tenant (or * for every tenant); nothing was changed.")
    connector = text_field("Connector", SPEND_CONNECTOR_CHARS,
                           required="Say which connector (such as model); nothing was changed.")
    per_day = text_field(PER_DAY_LABEL, 40)
    remove = forms.BooleanField(required=False)
    reason = text_field("Reason", MAX_TEXT_CHARS, required="A reason is required; it goes into the audit log.")
    expected = text_field("The limit you saw", 40, required=EXPECTED_REQUIRED)

    field_order = ["tenant", "connector", "per_day", "remove", "reason", "expected"]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("remove") or "per_day" in self.errors:
            data["amount"] = None
            return data
        if not data.get("per_day"):
            self.add_error("per_day", f"{PER_DAY_LABEL} is required (or remove the limit); nothing was changed.")
            return data
        try:
            data["amount"] = spend_per_day(data["per_day"], label=PER_DAY_LABEL)
        except InvalidFlowSetting as exc:
            self.add_error("per_day", f"{exc}; nothing was changed.")
        return data
