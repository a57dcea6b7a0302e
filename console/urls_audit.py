"""The audit log and its CSV export (console/views/audit.py). Read-only: no path changes an entry."""

from __future__ import annotations

from django.urls import path

from console.views import audit

urlpatterns = [
    path("audit/", audit.audit_log, name="audit"),
    path("audit.csv", audit.audit_csv, name="audit_csv"),
]
