"""The Django admin shows payloads and free text through the redaction policy
(core/redaction.py), as every console page does.

A ModelAdmin lists the model fields that may hold secrets in ``redacted_fields``. Each of them
is replaced, wherever the admin would show it (change page, changelist column), by a read-only
display of its redacted value: JSON as indented text, free text as text, in the field's place.
The change form is built from those names, so the raw field is in no form: neither its value
nor an input for it reaches the page.

Search never looks in them: ``get_search_fields`` leaves them out, whatever ``search_fields``
says, since a substring search would reveal what the page hides one guessed character at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from core.redaction import redact_json, redact_text

SUFFIX = "_redacted"


def shown_name(field: str) -> str:
    return field + SUFFIX


def _display(field: str) -> Callable[[Any, Any], Any]:
    def show(model_admin: Any, obj: Any) -> Any:
        value = getattr(obj, field)
        if value is None or value == "":
            return None  # the admin's "-"
        if isinstance(value, str):
            return redact_text(value)  # plain text: the admin escapes it
        return format_html('<pre class="redacted">{}</pre>', redact_json(value))

    show.__name__ = shown_name(field)
    return admin.display(description=f"{field.replace('_', ' ')} (redacted)")(show)


class RedactedFieldsAdmin(admin.ModelAdmin):
    """A ModelAdmin whose ``redacted_fields`` are only ever shown redacted (see the module
    docstring)."""

    redacted_fields: Sequence[str] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for field in cls.redacted_fields:
            setattr(cls, shown_name(field), _display(field))

    def _swap(self, names: Sequence[Any]) -> list[Any]:
        swapped: list[Any] = []
        for name in names:
            name = shown_name(name) if name in self.redacted_fields else name
            if name not in swapped:
                swapped.append(name)
        return swapped

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        readonly = self._swap(super().get_readonly_fields(request, obj))
        return readonly + [shown_name(f) for f in self.redacted_fields if shown_name(f) not in readonly]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        return self._swap(super().get_fields(request, obj))

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        return self._swap(super().get_list_display(request))

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        return [name for name in super().get_search_fields(request)
                if name.lstrip("^=@").split("__")[0] not in self.redacted_fields]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, never written through the admin: rows the product keeps itself (journal, counts,
    keys); put it first in the bases of an admin that has others."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
