"""The history page's query string (console/views/run_history.py): a page below ``before``, a
filter by ``kind`` (one kind or a group of them, console/selectors/history.py), or a jump to
the page holding entry ``seq``."""

from __future__ import annotations

from django import forms

from console.forms import Problems
from console.selectors.history import kind_choices
from console.selectors.payloads import MAX_SEQ


class HistoryPageForm(Problems, forms.Form):
    """Every field is optional: none at all is the newest page of every kind."""

    BEFORE_ERROR = "before must be a journal sequence number (a whole number from 1)"
    SEQ_ERROR = "Go to entry: give a journal sequence number (a whole number from 1)."
    KIND_ERROR = "Kind: that is not a kind of journal entry; pick one from the list."

    before = forms.IntegerField(required=False, min_value=1, max_value=MAX_SEQ, error_messages={
        "invalid": BEFORE_ERROR, "min_value": BEFORE_ERROR, "max_value": BEFORE_ERROR})
    kind = forms.ChoiceField(required=False, choices=kind_choices, label="Kind",
                             error_messages={"invalid_choice": KIND_ERROR})
    seq = forms.IntegerField(required=False, min_value=1, max_value=MAX_SEQ, label="Go to entry #",
                             error_messages={"invalid": SEQ_ERROR, "min_value": SEQ_ERROR, "max_value": SEQ_ERROR})
