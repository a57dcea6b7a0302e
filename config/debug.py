"""What Django's error reports (the DEBUG page, the error e-mails) may show.

Django's own filter hides settings whose names contain KEY, SECRET, PASS, TOKEN, ...; it shows
``DATABASE_URL`` and ``REDIS_URL`` in full, passwords included. This one also hides every setting
named like a URL or DSN, and masks the password of any ``scheme://user:password@host`` string
wherever the report shows one: settings (inside dicts and lists too), the request's META (which
holds the process environment under WSGI), its cookies and the traceback's local strings.
"""

from __future__ import annotations

import re
from typing import Any

from django.utils.safestring import SafeString
from django.views.debug import SafeExceptionReporterFilter

MASK = "********"
# scheme://user:password@  (the user may be empty: redis://:password@host)
_CREDENTIALS = re.compile(r"(?P<head>\b[a-z][a-z0-9+.\-]*://[^\s:/@]*:)(?P<password>[^\s@]+)@", re.I)


def mask_credentials(text: str) -> str:
    """``postgres://app:s3cret@db/x`` -> ``postgres://app:********@db/x``; other text unchanged."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}{MASK}@", text)


def _masked(value: Any) -> Any:
    # type(), not isinstance(): a lazy object claims to be a str, and is left unevaluated.
    return mask_credentials(value) if type(value) in (str, SafeString) else value


class CredentialsFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(SafeExceptionReporterFilter.hidden_settings.pattern + "|URL|DSN", flags=re.I)

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)  # recurses through dicts/lists via this method
        return _masked(cleansed)

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        return [(name, _masked(value)) for name, value in super().get_traceback_frame_variables(request, tb_frame)]
