"""OpenTelemetry spans for a run's attempts, steps, effects and compensations.

Off unless ``SAGAS_TRACING`` is on (``docs/operations/tracing.md``); the exporter then comes
from the standard ``OTEL_*`` variables. Every run is one trace, whose id *is* the run's id
(its 128 bits), so every worker that ever advances the run adds to the same trace and nothing
is stored for it. Spans, each with the run's ``saga.*`` attributes:

* ``run <workflow>``: an attempt, one claim of the run by a worker until it hands the run back.
  A root span of the run's trace; its span id derives from the run id and the attempt number.
* ``step <name>``, ``effect <name>`` (CLIENT) and ``compensation <step>`` (CLIENT), children of
  the attempt that did the work.

Contract:

* Only work done live gets a span. A step or effect whose outcome is journaled is replayed
  without one, so a run resumed after a crash shows each of its steps once. An effect whose
  intent is journaled but not its outcome (its worker died around the call) gets a span for
  its recovery (``saga.effect.recovery``): the provider is asked again.
* The effect or compensation span is current while the connector runs: ``trace_headers()``
  gives the connector its W3C ``traceparent`` to send, so a provider's logs name the span.
* A worker killed mid-attempt never ends (nor exports) that attempt's span. The worker that
  claims the run next finds in the journal a claim that has no end, and exports that
  attempt's span in its place (same span id, ``saga.attempt.lost``, from the claim to the
  dead worker's last journal entry), so the spans the dead worker had exported keep their
  parent. A crash in this process (``SystemExit``, ``sagas.testing``'s simulated crash) is
  treated the same way.
* Not guaranteed: spans still in a killed worker's export queue are lost (the SDK exports
  every ``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default); a worker frozen past its lease, or cut
  off from PostgreSQL before it handed the run back, may leave a second span for an attempt
  its successor exported as lost.
* Off, nothing of the SDK is imported, and a span helper costs a test of one global.
  Nothing here raises into the engine because of tracing.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from django.conf import settings

from ledger.errors import EffectFailed, KeyConflict, OutcomeUnknown
from ledger.journal import EFFECT_KINDS
from sagas.errors import EffectUnknown, EngineSignal, Suspend, Yield
from sagas.models import JournalEntry, JournalKind
from sagas.replay.cursor import JournalCursor
from sagas.store.systemdb import ClaimedRun

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context as OtelContext
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("sagas.tracing")

# The attributes (docs/operations/tracing.md lists them).
RUN_ID = "saga.run_id"
WORKFLOW = "saga.workflow"
VERSION = "saga.version"
BUSINESS_KEY = "saga.business_key"
TENANT = "saga.tenant"
ATTEMPT = "saga.attempt"
WORKER = "saga.worker"
OUTCOME = "saga.outcome"
LOST = "saga.attempt.lost"
STEP = "saga.step"
EFFECT = "saga.effect"
CONNECTOR = "saga.connector"
IDEMPOTENCY_KEY = "saga.idempotency_key"
EFFECT_STATUS = "saga.effect.status"
RECOVERY = "saga.effect.recovery"
ERROR_TYPE = "error.type"

# Journal kinds with which a worker ends its attempt: a claim followed by none of these from
# its worker was lost (killed, or frozen past its lease).
ATTEMPT_ENDS = frozenset({
    JournalKind.COMPLETED, JournalKind.FAILED, JournalKind.HALTED, JournalKind.YIELDED, JournalKind.SUSPENDED,
    JournalKind.COMPENSATION_FINISHED,
    "continued_as_new",  # sagas.replay.continuation.CONTINUED_AS_NEW (importing it would be a cycle)
})
SERVICE_NAME = "saga-console"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names one

_lock = threading.Lock()
_configured = False
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_forced = threading.local()  # (trace id, span id) the next span of this thread takes


# --- ids and links: pure functions, tracing on or off -------------------------------------------


def trace_id_of(run_id: Any) -> int:
    """The trace id of a run: its UUID's 128 bits."""
    return uuid.UUID(str(run_id)).int or _digest(f"trace:{run_id}", 16)


def trace_id_hex(run_id: Any) -> str:
    """The trace id of a run as tracing tools show it (32 lowercase hex digits)."""
    return f"{trace_id_of(run_id):032x}"


def attempt_span_id(run_id: Any, attempt: int) -> int:
    """The span id of the run's ``attempt``-th claim: the worker that ran it and the one that
    finds it lost derive the same."""
    return _digest(f"attempt:{run_id}:{attempt}", 8)


def _digest(text: str, size: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big") or 1


def trace_url(run_id: Any) -> str:
    """``SAGAS_TRACE_URL_TEMPLATE`` with ``{trace_id}`` (and ``{run_id}``) filled in; "" when unset.
    The values put in are hex digits and a UUID, so the URL stays as the template wrote it."""
    template = settings.SAGAS_TRACE_URL_TEMPLATE
    if not template:
        return ""
    return template.replace("{trace_id}", trace_id_hex(run_id)).replace("{run_id}", quote(str(run_id), safe=""))


# --- turning it on ----------------------------------------------------------------------------------


def _configure_once() -> None:
    global _configured
    if _configured:
        return
    with _lock:
        if _configured:
            return
        if settings.SAGAS_TRACING:
            try:
                _start(_exporters_from_environment(), batch=True, set_global=True)
            except Exception:  # a broken exporter must not stop the engine: no spans, one log line
                log.exception("tracing is on (SAGAS_TRACING) but could not start; no spans are recorded")
        _configured = True


def _exporters_from_environment() -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    for name in settings.SAGAS_TRACING_EXPORTERS:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())  # endpoint, headers, timeout... from OTEL_EXPORTER_OTLP_*
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
    return exporters


def start_exporting(exporter: SpanExporter, *, batch: bool = False) -> TracerProvider:
    """Record spans in this process and hand them to ``exporter`` (a test's
    ``InMemorySpanExporter``; ``batch=False`` exports each span as it ends). Replaces what
    ``SAGAS_TRACING`` configured; ``stop_exporting`` turns tracing off again."""
    global _configured
    with _lock:
        _stop()
        provider = _start([exporter], batch=batch, set_global=False)
        _configured = True
    return provider


def stop_exporting() -> None:
    """Flush and shut down what records spans in this process: tracing is off from here."""
    global _configured
    with _lock:
        _stop()
        _configured = True


def _start(exporters: list[SpanExporter], *, batch: bool, set_global: bool) -> TracerProvider:
    global _tracer, _provider
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource, id_generator=_run_ids())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    if set_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # a connector's own spans (or HTTP instrumentation) go with ours
    _tracer, _provider = provider.get_tracer("sagas"), provider
    return provider


def _stop() -> None:
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _run_ids() -> RandomIdGenerator:
    """Random ids, except for the next span of a thread that set ``_forced.ids``: an attempt
    (the run's trace id, the attempt's derived span id)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            forced = getattr(_forced, "ids", None)
            return forced[0] if forced else super().generate_trace_id()

        def generate_span_id(self) -> int:
            forced = getattr(_forced, "ids", None)
            return forced[1] if forced else super().generate_span_id()

        def is_trace_id_random(self) -> bool:
            return False  # a run id is not always random (a child's derives from its parent's)

    return RunIds()


# --- spans ------------------------------------------------------------------------------------------


class _Off:
    """What a span helper returns while tracing is off, or for replayed work: nothing happens."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def outcome(self, value: str) -> None:
        pass


OFF = _Off()


def _crashed(exc: BaseException | None) -> bool:
    """The process is going down (a kill it saw, ``SystemExit``, a simulated crash): the span
    is left unended, as a SIGKILL would leave it."""
    return exc is not None and not isinstance(exc, (Exception, EngineSignal))


def _status_of(exc: BaseException) -> str:
    if isinstance(exc, EffectFailed):
        return "FAILED_FINAL"
    if isinstance(exc, KeyConflict):
        return "REFUSED"
    if isinstance(exc, (OutcomeUnknown, EffectUnknown)):
        return "UNKNOWN"
    if isinstance(exc, Suspend):
        return "HELD"  # flow control held the call back: never sent, the run waits
    if isinstance(exc, Yield):
        return "YIELDED"  # the worker stopped between two attempts: the next one retries, same key
    return "ERROR"


class _Live:
    """A recording span, current (its context attached) between enter and exit."""

    def __init__(self, span: Span, *, effect: bool = False) -> None:
        self.span, self.effect = span, effect
        self.token: Token[OtelContext] | None = None
        self.result = ""

    def __enter__(self) -> _Live:
        from opentelemetry import context, trace

        self.token = context.attach(trace.set_span_in_context(self.span))
        return self

    def outcome(self, value: str) -> None:
        self.result = value

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if self.token is not None:
            context.detach(self.token)
        if _crashed(exc):
            return
        try:
            span = self.span
            if exc is not None:
                if self.effect:
                    span.set_attribute(EFFECT_STATUS, _status_of(exc))
                if not isinstance(exc, (Suspend, Yield)):  # handed back, not failed
                    kind = getattr(exc, "error_class", "") or getattr(exc, "error_type", "") or type(exc).__name__
                    span.set_attribute(ERROR_TYPE, str(kind))
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            elif self.effect:
                span.set_attribute(EFFECT_STATUS, "SUCCEEDED")
            if self.result:
                span.set_attribute(OUTCOME, self.result)
            span.end()
        except Exception:
            log.exception("could not end a span")


def _run_attributes(run: ClaimedRun) -> dict[str, Any]:
    return {RUN_ID: str(run.id), WORKFLOW: run.workflow_name, VERSION: run.version,
            BUSINESS_KEY: run.business_key, TENANT: run.tenant}


def _child(name: str, cursor: JournalCursor, attributes: dict[str, Any], *, client: bool = False) -> _Live | _Off:
    tracer = _tracer
    if tracer is None:
        return OFF
    from opentelemetry.trace import SpanKind

    try:
        span = tracer.start_span(name, kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
                                 attributes={**_run_attributes(cursor.claimed), **attributes})
    except Exception:
        log.exception("could not start span %s", name)
        return OFF
    return _Live(span, effect=client)


def step_span(cursor: JournalCursor, name: str) -> _Live | _Off:
    """The span of step ``name`` (its unique name) executed live."""
    if _tracer is None:
        return OFF
    return _child(f"step {name.partition('#')[0]}", cursor, {STEP: name})


def effect_span(cursor: JournalCursor, name: str, connector: str, key: str | None) -> _Live | _Off:
    """The span of ``ctx.effect(name, connector)`` at the cursor: live, or recovering an effect
    whose intent is journaled without its outcome; ``OFF`` for one whose outcome is journaled
    (replay: no span), or when tracing is off."""
    if _tracer is None:
        return OFF
    unique = cursor.next_unique_name(name)
    recorded = cursor.peek()
    if recorded is not None:
        if recorded.kind != EFFECT_KINDS.intent or recorded.name != unique:
            return OFF  # journaled as refused, or not this call at all (the protocol says why)
        if cursor.recorded_event(EFFECT_KINDS.result, unique) is not None:
            return OFF
    attributes: dict[str, Any] = {EFFECT: unique, CONNECTOR: connector,
                                  IDEMPOTENCY_KEY: key or cursor.effect_key(unique)}
    if recorded is not None:
        attributes[RECOVERY] = True
    return _child(f"effect {name}", cursor, attributes, client=True)


def compensation_span(cursor: JournalCursor, step: str, connector: str, key: str) -> _Live | _Off:
    """The span of undoing effect ``step`` (a compensation not yet recorded as done)."""
    if _tracer is None:
        return OFF
    return _child(f"compensation {step.partition('#')[0]}", cursor,
                  {EFFECT: step, CONNECTOR: connector, IDEMPOTENCY_KEY: key}, client=True)


class _Attempt(_Live):
    def __init__(self, span: Span, run: ClaimedRun) -> None:
        super().__init__(span)
        self.run = run

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.result == "lease_lost" and exc is None and _taken_over(self.run):
            from opentelemetry import context

            if self.token is not None:
                context.detach(self.token)  # the worker that took the run over exported this attempt
            return
        super().__exit__(exc_type, exc, tb)


def attempt_span(run: ClaimedRun, worker: str) -> _Live | _Off:
    """The span of this claim of ``run``, current while the worker advances it; set its
    ``outcome`` before the end. Exports the previous attempt's span first if it was lost."""
    _configure_once()
    tracer = _tracer
    if tracer is None:
        return OFF
    from opentelemetry import context

    attributes = {**_run_attributes(run), ATTEMPT: run.attempts, WORKER: worker}
    if run.attempts > 1:
        try:
            _export_lost_attempt(tracer, run)
        except Exception:  # our storage, most likely: the engine finds out for itself
            log.warning("run %s: could not look for a lost attempt to trace", run.id, exc_info=True)
    _forced.ids = (trace_id_of(run.id), attempt_span_id(run.id, run.attempts))
    try:
        span = tracer.start_span(f"run {run.workflow_name}", context=context.Context(), attributes=attributes)
    except Exception:
        log.exception("could not start the span of run %s", run.id)
        return OFF
    finally:
        _forced.ids = None
    return _Attempt(span, run)


def _taken_over(run: ClaimedRun) -> bool:
    """Another worker claimed the run after this claim (and so exported this attempt's span)."""
    try:
        return JournalEntry.objects.filter(run_id=uuid.UUID(str(run.id)), kind=JournalKind.CLAIMED,
                                          seq__gt=run.last_seq).exists()
    except Exception:
        return False


def _export_lost_attempt(tracer: Tracer, run: ClaimedRun) -> None:
    """If the claim before ``run``'s was never ended by its worker, export its span now."""
    from opentelemetry import context
    from opentelemetry.trace import Status, StatusCode

    entries = JournalEntry.objects.filter(run_id=uuid.UUID(str(run.id)), seq__lt=run.last_seq)
    claim = entries.filter(kind=JournalKind.CLAIMED).order_by("-seq").values_list(
        "seq", "worker_id", "created_at", "payload").first()
    if claim is None:
        return
    seq, worker, started, payload = claim
    attempt = payload.get("attempt") if isinstance(payload, dict) else None
    if not isinstance(attempt, int):
        return
    last = entries.filter(seq__gt=seq, worker_id=worker).order_by("-seq").values_list("kind", "created_at").first()
    if last is not None and last[0] in ATTEMPT_ENDS:
        return
    ended = last[1] if last is not None else started
    attributes = {**_run_attributes(run), ATTEMPT: attempt, WORKER: worker, LOST: True}
    _forced.ids = (trace_id_of(run.id), attempt_span_id(run.id, attempt))
    try:
        span = tracer.start_span(f"run {run.workflow_name}", context=context.Context(), attributes=attributes,
                                 start_time=_nanos(started))
    finally:
        _forced.ids = None
    span.set_status(Status(StatusCode.ERROR, "the worker stopped without ending its attempt (killed, or lost "
                                             "its lease); exported by the worker that took the run over"))
    span.end(end_time=_nanos(ended))


def _nanos(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


# --- what a connector sends -------------------------------------------------------------------------


def trace_headers() -> dict[str, str]:
    """The W3C trace context of the effect or compensation in flight (``traceparent``, and
    ``tracestate`` if any), for a connector to add to its request headers so the provider's
    logs and spans name the effect that called it. ``{}`` when tracing is off or no span is
    current. The same context is current for OpenTelemetry's HTTP client instrumentations."""
    if _tracer is None:
        return {}
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


__all__ = [
    "OFF", "attempt_span", "compensation_span", "effect_span", "start_exporting", "step_span",
    "stop_exporting", "trace_headers", "trace_id_hex", "trace_id_of", "trace_url",
]
