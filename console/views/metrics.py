"""``/metrics``: the Prometheus exposition of console/metrics.py, behind a bearer token.

No ``METRICS_TOKEN`` configured: 404 (the endpoint does not exist). Otherwise the request must
carry ``Authorization: Bearer <token>``; anything else is a 401, the token compared in constant
time. No session or console role is involved: Prometheus is not a user."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from console.metrics import SagaCollector

REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(SagaCollector())


def _authorized(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404("metrics are not enabled")
    if not _authorized(request, token):
        response = HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # The text format Prometheus asks for: OpenMetrics when its Accept header offers it, else 0.0.4.
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(REGISTRY), content_type=content_type)
