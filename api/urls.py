"""The console pages of the ``api`` app (``api/views.py``), mounted by ``config/urls.py`` under
``/api-keys/`` beside the console's own, as namespace ``api_pages``."""

from __future__ import annotations

from django.urls import path

from api import views

app_name = "api_pages"

urlpatterns = [
    # The HTTP API's keys (staff): list, expire now, revoke; and its webhooks in (read-only).
    path("", views.api_keys, name="api_keys"),
    path("<int:key_id>/expire/", views.api_key_expire, name="api_key_expire"),
    path("<int:key_id>/revoke/", views.api_key_revoke, name="api_key_revoke"),
]
