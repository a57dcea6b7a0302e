"""URL map of the console. Each page family keeps its own pattern list in ``console/urls_*.py``."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path

from console import urls_actions, urls_audit, urls_queues, urls_runs
from console.views import base

app_name = "console"

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", base.overview, name="overview"),
    path("", include(urls_runs)),
    path("", include(urls_queues)),
    path("", include(urls_actions)),
    path("", include(urls_audit)),
]
