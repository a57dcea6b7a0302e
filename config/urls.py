from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # RQ's queue dashboard (django-rq): staff only, as each of its views requires
    # (staff_member_required; its JSON stats also take RQ_API_TOKEN, unset here).
    path("django-rq/", include("django_rq.urls")),
    path("", include("console.urls")),
]
