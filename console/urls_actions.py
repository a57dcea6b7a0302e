"""Operator actions: POSTs with CSRF that go through console.services (role, stale state, audit)."""

from __future__ import annotations

from django.urls import path

from console.views import runs

urlpatterns = [
    # Runs (console/views/runs.py). GET compensate/ shows the plan before anything is done.
    path("runs/<uuid:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<uuid:run_id>/retry/", runs.run_retry, name="run_retry"),
    path("runs/<uuid:run_id>/compensate/", runs.run_compensate, name="run_compensate"),
]
