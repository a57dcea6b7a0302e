"""The runs list (console/views/run_list.py) and the run detail page (console/views/runs.py)."""

from __future__ import annotations

from django.urls import path

from console.views import run_list, runs

urlpatterns = [
    path("runs/", run_list.runs_list, name="runs"),
    path("runs/<uuid:run_id>/", runs.run_detail, name="run"),
    path("runs/<uuid:run_id>/history/", runs.run_history, name="run_history"),
    path("runs/<uuid:run_id>/history.json", runs.run_history_json, name="run_history_json"),
]
