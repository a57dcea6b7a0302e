"""``webhook.post``: POSTs one delivery's body to its endpoint, signed (``signing``), with a
stable message id.

The payload names the delivery and carries the body; the URL and the secret are read from the
endpoint when the call is made, so neither is ever stored in a run, an effect or the journal.

A webhook receiver neither dedupes for us nor can be asked what it received, so the ledger
treats this connector as it treats a plain email API: the effect is marked IN_PROGRESS before
the call, and a worker that dies after it leaves the effect UNKNOWN for a person, never sent
twice. The message id, ``webhook-id`` (Standard Webhooks) and ``Idempotency-Key`` alike, is the
effect's key, the same on every retry, so a receiver that dedupes drops a repeat; each attempt
is signed anew, with its own ``webhook-timestamp``.

What each answer means for the ledger:

* 2xx: succeeded.
* no whole request sent (the name not resolved, the connection refused or not made in time, TLS
  refused), 429, 500, 502, 503, 504: ``Retryable``, retried with
  back-off (1 s, 2 s, 4 s ... up to 30 s; 6 attempts within 120 s), then failed.
* a 3xx (never followed), another 4xx, the endpoint deleted or deactivated, its secret unusable
  for its scheme: ``Final``, failed, never retried.
* no answer within ``NOTIFY_TIMEOUT`` once the request was sent: ``Timeout``, UNKNOWN (it may have
  arrived: retrying could send it twice).

A 5xx is retried although the receiver may have acted before failing: receivers answer 5xx
when they did not take the message, and the stable message id covers the rest.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from django.conf import settings

from console.notifications import signing
from console.notifications.models import NotificationEndpoint
from ledger import Connector, Final, Retryable, Timeout, connector

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer (a 3xx: ``Final``), never followed: urllib would turn the POST into a GET."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)
USER_AGENT = "SagaConsole-Webhook/1"


@connector("webhook.post")
class WebhookPost(Connector):
    """``{delivery, endpoint, body}``: POST ``body`` to the endpoint's URL, signed with its secret."""

    max_attempts, backoff_seconds, backoff_factor, backoff_max_seconds, deadline_seconds = 6, 1.0, 2.0, 30.0, 120.0

    def execute(self, payload: dict[str, Any], *, key: str) -> dict[str, Any]:
        endpoint = NotificationEndpoint.objects.filter(id=payload["endpoint"]).first()
        if endpoint is None or not endpoint.active:
            raise Final(f"endpoint {payload['endpoint']} was deleted or deactivated; nothing was sent")
        raw = signing.encode(payload["body"])
        try:
            signed = signing.signed_headers(endpoint, msg_id=key, raw=raw)
        except signing.BadSecret as exc:
            raise Final(f"endpoint {endpoint.name!r}: {exc}; nothing was sent") from exc
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Idempotency-Key": key,
                   "X-Saga-Delivery": str(payload["delivery"]), **signed}
        request = urllib.request.Request(endpoint.url, data=raw, method="POST", headers=headers)
        timeout = settings.NOTIFY_TIMEOUT
        try:
            answer = _opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            answer = exc
        except urllib.error.URLError as exc:
            # urllib raises URLError only while resolving, connecting (TLS included) or sending:
            # the request was never written whole, so it cannot have been taken.
            if isinstance(exc.reason, TimeoutError):
                raise Retryable(f"endpoint {endpoint.name!r}: no connection within {timeout:g}s") from exc
            raise Retryable(f"endpoint {endpoint.name!r}: {exc.reason}; nothing was sent") from exc
        except TimeoutError as exc:
            raise Timeout(f"endpoint {endpoint.name!r}: no answer within {timeout:g}s; it may have arrived") from exc
        try:
            with answer:
                text = answer.read(2000).decode("utf-8", errors="replace")
        except TimeoutError as exc:
            raise Timeout(
                f"endpoint {endpoint.name!r}: answer cut off after {timeout:g}s; it may have arrived"
            ) from exc
        status = answer.code
        if 200 <= status < 300:
            return {"status": status, "delivery": payload["delivery"], "answer": text[:500]}
        if status in RETRYABLE_STATUSES:
            raise Retryable(f"endpoint {endpoint.name!r}: HTTP {status}: {text[:200]}")
        raise Final(f"endpoint {endpoint.name!r}: HTTP {status}: {text[:200]}")

    def downstream_ref(self, result: dict[str, Any]) -> str:
        return f"HTTP {result.get('status')}" if isinstance(result, dict) else ""
