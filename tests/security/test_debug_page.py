"""The DEBUG page never shows a credential: DSN-like settings are hidden, and the password of any
``scheme://user:password@host`` string is masked in settings, request headers and local variables."""

from __future__ import annotations

from django.test import Client
from django.urls import path
from django.utils.functional import SimpleLazyObject


def fails(request):
    # A local variable holding a DSN (built at run time: the page also shows this source line).
    upstream = f"postgres://app:{request.headers['X-Db-Password']}@db.internal:5432/orders"  # noqa: F841
    pending = SimpleLazyObject(lambda: "a lazy string (request.csp_nonce is one)")  # noqa: F841
    raise RuntimeError("the upstream did not answer")


urlpatterns = [path("fails/", fails)]


def test_it_shows_a_debug_page_without_the_database_or_redis_password(settings):
    settings.DEBUG = True
    settings.ROOT_URLCONF = __name__
    settings.DATABASE_URL = "postgres://app:pg-s3cret-1@db.internal:5432/saga_console"
    settings.REDIS_URL = "redis://:redis-s3cret-2@cache.internal:6379/0"
    settings.UPSTREAM_QUEUES = ["amqp://worker:amqp-s3cret-3@mq.internal:5672/"]

    response = Client(raise_request_exception=False).get(
        "/fails/", HTTP_X_UPSTREAM="https://u:hdr-s3cret-4@h.example/", HTTP_X_DB_PASSWORD="local-s3cret-5")

    page = response.content.decode()
    secrets = ("pg-s3cret-1", "redis-s3cret-2", "amqp-s3cret-3", "hdr-s3cret-4", "local-s3cret-5")
    assert response.status_code == 500
    assert "the upstream did not answer" in page and "DATABASE_URL" in page and "HTTP_X_UPSTREAM" in page
    for secret in secrets:
        assert secret not in page, f"{secret} is on the debug page"
    assert "amqp://worker:********@mq.internal:5672/" in page  # masked, the rest still helps debugging
