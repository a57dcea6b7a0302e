from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from api.api import api
from console.views.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    # RQ's queue dashboard (django-rq): staff only, as each of its views requires
    # (staff_member_required; its JSON stats also take RQ_API_TOKEN, unset here).
    path("django-rq/", include("django_rq.urls")),
    # Prometheus (console/metrics.py): 404 unless METRICS_TOKEN is set, then a bearer token.
    path("metrics", metrics, name="metrics"),
    # The JSON API (api/): API keys, problem JSON; OpenAPI at /api/v1/openapi.json.
    path("api/v1/", api.urls),
    path("", include("console.urls")),
]
