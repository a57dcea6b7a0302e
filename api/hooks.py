"""Signed webhooks in: a payment provider's "settled" callback becomes a signal for a run.

Signature: Standard Webhooks (``core.webhooks``, checked with the ``standardwebhooks`` library)::

    webhook-id: <the message's id, the same on every retry>
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(base64-decoded secret, "<id>.<timestamp>.<raw body>")>

The HMAC is over the raw body bytes as sent (never a re-serialised JSON), keyed with the bytes
the hook's ``whsec_<base64>`` secret encodes. The signature header may hold several
space-separated entries (a sender rotating its secret); one that matches is enough. A timestamp
more than ``TOLERANCE_S`` (5 minutes) in the past or the future is refused. The ``webhook-id`` is
the message's identity: a delivery whose id this hook accepted before (the sender's retry,
re-signed, or a captured request replayed) is answered 200 with ``"duplicate": true`` and sends
nothing, so the sender stops retrying.

Hooks made before Standard Webhooks (``SignatureScheme.LEGACY``) take what they always took until
their secret is rotated (``hook_rotate``, ``manage.py rotatehook``): ``X-Saga-Timestamp: <unix
seconds>`` and ``X-Saga-Signature: v1=<hex HMAC-SHA256(secret text, "<timestamp>.<raw body>")>``
(comma-separated entries), a signature accepted once is refused for good (``HookReceipt``:
409 ``replay``), and the body's own ``"event_id"`` dedupes as the ``webhook-id`` does. While a
rotation's overlap lasts, a delivery signed either way with the secret of that way is accepted.

The body is a JSON object naming the run: ``{"run_id": ...}`` or ``{"business_key": ...,
"workflow": ...}`` (workflow optional when the hook names one, or the key is unique in the
hook's tenant), and ``"payload"``, the signal's payload (without it, the whole body is).
A hook only reaches runs of its tenant, and of its workflow when it names one.

Guarantees: an accepted delivery writes its receipt, the signal and its audit entry
(``system: hook <name>``, ``run.signal``) in one transaction; a refused one writes nothing.
Refusals are logged (logger ``api.hooks``), not audited: before the signature is checked
anyone can send them, and an audit row per attempt would let a stranger flood the audit log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction

from api.errors import Problem
from api.models import Hook, HookReceipt
from core import webhooks
from core.webhooks import SignatureScheme
from operators.actors import system_label
from operators.services.actions import Actor, audit_done
from sagas.errors import InvalidArgument, NotSerializable, RunFinished
from sagas.integration import SIGNAL_NAME_CHARS, checked_text
from sagas.models import WorkflowRun

log = logging.getLogger("api.hooks")

MAX_BODY_BYTES = 256 * 1024
TOLERANCE_S = webhooks.TOLERANCE_SECONDS
LEGACY_SCHEME = "v1"
LEGACY_TIMESTAMP_HEADER = "X-Saga-Timestamp"
LEGACY_SIGNATURE_HEADER = "X-Saga-Signature"


@dataclass(frozen=True)
class Delivery:
    """An accepted delivery: the signal ``signal`` was sent to run ``run``."""

    hook: Hook
    run: WorkflowRun
    signal: str
    duplicate: bool = False  # an event id accepted before: nothing was sent this time


@dataclass(frozen=True)
class _Verified:
    signature: str  # the matching signature, never accepted twice
    event_id: str | None  # the webhook-id; None for a legacy delivery (its body may name one)


def legacy_sign(*, secret: str, timestamp: int | str, body: bytes) -> str:
    """A legacy hook's ``X-Saga-Signature`` value for ``body`` sent at ``timestamp``: ``v1=<hex>``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{LEGACY_SCHEME}={mac.hexdigest()}"


def hook_create(*, name: str, signal: str, workflow: str = "", tenant: str = "default") -> tuple[Hook, str]:
    """A new enabled hook and its secret (show it once to whoever configures the sender).
    ``ValueError`` for a name in use or a signal name ``ctx.wait_for`` could never take."""
    try:
        signal = checked_text(signal, what="the signal name", max_length=SIGNAL_NAME_CHARS, required=True,
                              one_line=True)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    if Hook.objects.filter(name=name).exists():
        raise ValueError(f"a hook named {name!r} exists already")
    secret = webhooks.new_secret()
    hook = Hook.objects.create(name=name, secret=secret, signature_scheme=SignatureScheme.STANDARD, signal=signal,
                               workflow=workflow, tenant=tenant)
    return hook, secret


def hook_rotate(*, name: str, keep_old: timedelta = timedelta(0)) -> tuple[Hook, str]:
    """A new Standard Webhooks secret for hook ``name`` (show it once); for ``keep_old`` the
    replaced one is accepted too, in its own scheme (a legacy hook's old headers as well), so
    the sender can switch when it deploys. ``ValueError`` for no such hook."""
    with transaction.atomic():
        hook = Hook.objects.select_for_update().filter(name=name).first()
        if hook is None:
            raise ValueError(f"no hook named {name!r}")
        secret = hook.rotate_secret(keep_old=keep_old)
        hook.save(update_fields=["secret", "signature_scheme", "previous_secret", "previous_scheme",
                                 "previous_until"])
    return hook, secret


def _refuse(hook_name: str, ip: Any, kind: str, detail: str) -> Problem:
    log.warning("hook %r refused from %s: %s (%s)", hook_name[:60], ip, detail, kind)
    return Problem(kind, detail)


def _verified(hook: Hook, *, headers: Mapping[str, str], body: bytes, ip: Any) -> _Verified:
    """The delivery's signature (and ``webhook-id``), or a ``signature`` problem saying why not.
    Standard Webhooks headers are checked against the hook's standard secrets in use; the legacy
    headers against its legacy secret (a hook made before, or one in a rotation's overlap)."""
    standard = hook.secrets_in_use(SignatureScheme.STANDARD)
    legacy = hook.secrets_in_use(SignatureScheme.LEGACY)
    sent_standard = webhooks.has_headers(headers)
    sent_legacy = bool(headers.get(LEGACY_SIGNATURE_HEADER.lower()) or headers.get(LEGACY_TIMESTAMP_HEADER.lower()))
    if sent_standard and standard:
        try:
            event_id, signature = webhooks.verify(standard, headers=headers, body=body)
        except webhooks.Refused as exc:
            raise _refuse(hook.name, ip, "signature", str(exc)) from None
        return _Verified(signature=signature, event_id=event_id)
    if sent_legacy and legacy:
        return _Verified(signature=_verified_legacy(hook, legacy[0], headers=headers, body=body, ip=ip),
                         event_id=None)
    wanted = [f"{webhooks.ID_HEADER}, {webhooks.TIMESTAMP_HEADER} and {webhooks.SIGNATURE_HEADER} (Standard "
              "Webhooks)"] if standard else []
    if legacy:
        wanted.append(f"{LEGACY_TIMESTAMP_HEADER} and {LEGACY_SIGNATURE_HEADER} (the legacy scheme, until the "
                      "hook's secret is rotated to Standard Webhooks)")
    note = f"; {LEGACY_SIGNATURE_HEADER} is the legacy scheme of hooks made before" if sent_legacy else ""
    raise _refuse(hook.name, ip, "signature", f"hook {hook.name} takes {' or '.join(wanted)}: send those{note}")


def _verified_legacy(hook: Hook, secret: str, *, headers: Mapping[str, str], body: bytes, ip: Any) -> str:
    """The matching legacy signature's hex digest, or a ``signature`` problem saying why not."""
    timestamp = headers.get(LEGACY_TIMESTAMP_HEADER.lower(), "")
    signature = headers.get(LEGACY_SIGNATURE_HEADER.lower(), "")
    if not timestamp or not signature:
        raise _refuse(hook.name, ip, "signature",
                      f"send both {LEGACY_TIMESTAMP_HEADER} and {LEGACY_SIGNATURE_HEADER} headers")
    try:
        sent_at = int(timestamp.strip())
    except ValueError:
        raise _refuse(hook.name, ip, "signature", f"{LEGACY_TIMESTAMP_HEADER} must be unix seconds") from None
    now = time.time()
    if sent_at < now - TOLERANCE_S:
        raise _refuse(hook.name, ip, "signature",
                      f"the timestamp is {int(now - sent_at)} s old; at most {TOLERANCE_S} s are accepted")
    if sent_at > now + TOLERANCE_S:
        raise _refuse(hook.name, ip, "signature", f"the timestamp is {int(sent_at - now)} s in the future; "
                                                  f"at most {TOLERANCE_S} s are accepted (check the sender's clock)")
    expected = legacy_sign(secret=secret, timestamp=timestamp.strip(), body=body).partition("=")[2]
    for part in signature.split(",")[:8]:
        scheme, _, digest = part.strip().partition("=")
        if scheme == LEGACY_SCHEME and hmac.compare_digest(digest.encode(), expected.encode()):
            return expected
    raise _refuse(hook.name, ip, "signature",
                  f"no {LEGACY_SCHEME} signature matches HMAC-SHA256(secret, '<timestamp>.<raw body>')")


def _run_named(hook: Hook, doc: dict[str, Any], ip: Any) -> WorkflowRun:
    """The run the body names, within the hook's tenant (and workflow, when it names one)."""
    runs = WorkflowRun.objects.filter(tenant=hook.tenant)
    workflow = doc.get("workflow") or hook.workflow
    if not isinstance(workflow, str):
        raise _refuse(hook.name, ip, "validation", "'workflow' must be a string")
    if hook.workflow and workflow != hook.workflow:
        raise _refuse(hook.name, ip, "validation", f"hook {hook.name} only signals runs of {hook.workflow}")
    if workflow:
        runs = runs.filter(workflow_name=workflow)
    if doc.get("run_id") is not None:
        try:
            run_id = uuid.UUID(str(doc["run_id"]))
        except ValueError:
            raise _refuse(hook.name, ip, "validation", "'run_id' is not a run id (a UUID)") from None
        found = list(runs.filter(id=run_id)[:1])
        named = f"run {run_id}"
    elif isinstance(doc.get("business_key"), str) and doc["business_key"]:
        found = list(runs.filter(business_key=doc["business_key"])[:2])
        named = f"a run with business key {doc['business_key'][:200]!r}"
        if len(found) > 1:
            raise _refuse(hook.name, ip, "validation",
                          "several workflows have a run with this business key; name the 'workflow'")
    else:
        raise _refuse(hook.name, ip, "validation", "the body must name the run: 'run_id' or 'business_key'")
    if not found:
        raise _refuse(hook.name, ip, "not-found", f"hook {hook.name} finds no {named} in tenant {hook.tenant}"
                                                  f"{' of workflow ' + workflow if workflow else ''}")
    return found[0]


def _duplicate(hook: Hook, run: WorkflowRun, event_id: str, ip: Any) -> Delivery:
    log.info("hook %s: event %r delivered again from %s; already accepted, nothing sent", hook.name,
             event_id[:60], ip)
    return Delivery(hook=hook, run=run, signal=hook.signal, duplicate=True)


def hook_deliver(*, name: str, headers: Mapping[str, str], body: bytes, ip: Any = None) -> Delivery:
    """Verify a delivery to hook ``name`` (``headers``: the request's, any case) and send its
    signal to the run it names; a message id accepted before is answered as a duplicate.

    Refusals (``Problem``), in the order checked: ``payload-too-large`` (over
    ``MAX_BODY_BYTES``), ``not-found`` (no such enabled hook), ``signature`` (missing, stale,
    future or wrong), ``validation`` (not a JSON object naming a run; a payload that cannot be
    stored), ``not-found`` (no such run for this hook), ``replay`` (a legacy signature accepted
    before), ``conflict`` (the run is finished). Only the signature's check touches the secret;
    nothing of the body is parsed before it passed.
    """
    from sagas.integration import signal_send

    if len(body) > MAX_BODY_BYTES:
        raise _refuse(name, ip, "payload-too-large", f"a hook body may hold at most {MAX_BODY_BYTES} bytes")
    hook = Hook.objects.filter(name=name, enabled=True).first()
    if hook is None:
        raise _refuse(name, ip, "not-found", f"no enabled hook named {name[:60]!r}")
    verified = _verified(hook, headers={k.lower(): v for k, v in headers.items()}, body=body, ip=ip)
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise _refuse(hook.name, ip, "validation", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise _refuse(hook.name, ip, "validation", "the body must be a JSON object")
    event_id = doc.get("event_id", "") if verified.event_id is None else verified.event_id
    if not isinstance(event_id, str) or len(event_id) > 200 or "\x00" in event_id:
        raise _refuse(hook.name, ip, "validation", "event_id must be a string of at most 200 characters")
    run = _run_named(hook, doc, ip)
    payload = doc.get("payload", doc)
    if event_id and HookReceipt.objects.filter(hook=hook, event_id=event_id).exists():
        return _duplicate(hook, run, event_id, ip)
    actor = Actor(user=None, ip=ip, system=f"hook {hook.name}")  # type: ignore[arg-type]  # no user: the secret
    try:
        with transaction.atomic():
            try:
                with transaction.atomic():
                    HookReceipt.objects.create(hook=hook, signature=verified.signature, event_id=event_id,
                                               run_id=run.id)
            except IntegrityError:
                if event_id and HookReceipt.objects.filter(hook=hook, event_id=event_id).exists():
                    return _duplicate(hook, run, event_id, ip)  # the same event, delivered at the same moment
                raise _refuse(hook.name, ip, "replay", "this signature was accepted before; sign each delivery "
                                                       "with its own timestamp") from None
            got_it = signal_send(run_id=str(run.id), name=hook.signal, payload=payload,
                                 actor=system_label(actor.system))
            audit_done(actor, "run.signal", "run", run.id, reason=hook.signal, tenant=run.tenant,
                       after={"signal": hook.signal, "hook": hook.name, "delivered_to": got_it})
            # The run that got it (a run that continued as new passes it down its chain), with the
            # status this delivery left it in (PENDING when it woke it), read before the commit
            # lets a worker claim it: read after, the answer said RUNNING or PENDING by the
            # worker's speed.
            run = WorkflowRun.objects.get(id=got_it)
    except RunFinished as exc:
        raise _refuse(hook.name, ip, "conflict", str(exc)) from None
    except WorkflowRun.DoesNotExist:  # deleted between the lookup and the lock
        raise _refuse(hook.name, ip, "not-found", f"run {run.id} no longer exists") from None
    except (InvalidArgument, NotSerializable) as exc:
        raise _refuse(hook.name, ip, "validation", str(exc)) from None
    log.info("hook %s: signal %s sent to run %s", hook.name, hook.signal, run.id)
    return Delivery(hook=hook, run=run, signal=hook.signal)
