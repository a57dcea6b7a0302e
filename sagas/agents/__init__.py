"""Durable pydantic-ai agents: model turns journaled, tool calls ledgered, approvals as waits.

Run an ``Agent`` inside a workflow with ``run_agent(ctx, agent, prompt)``:

* **Each model request is a journaled step** (``<name>.model``, ``#2``... for later turns).
  On replay the recorded ``ModelResponse`` is handed back and the model is not called; a
  crash during a request repeats only that request, and the repeat carries the same
  ``Idempotency-Key`` (``<run id>:<name>:turn-<n>``, in ``model_settings["extra_headers"]``),
  so a gateway that honours keys bills it once.
* **Each tool call** is journaled too. A tool made with ``effect_tool("payments.capture")``
  is a ledgered effect (``ctx.effect``): intent, stable key, lookup, UNKNOWN, compensation
  and, for an irreversible connector, the approval gate are the connector's. Its Python
  function only builds the connector's payload from the model's arguments. Any other tool is
  a ``ctx.step`` (``<name>.tool.<tool>``): right for reads; a plain tool that acts on the
  world is at-least-once, like every other durable-execution integration's.
* **Approvals.** pydantic-ai's own approval-required tools (``requires_approval=True``, or a
  tool raising ``ApprovalRequired``) become approvals in the console's inbox
  (``<name>.approve.<tool>``); the run waits holding no worker, and the decision goes back to
  the model as the tool's result: approved runs the tool, rejected tells the model who said no
  and why. A rejected irreversible effect tool is reported to the model the same way.
* **Cost.** Token usage is priced with ``settings.SAGAS_MODEL_PRICES`` (usd per million input
  and output tokens, by model name, ``"*"`` for any other) and charged with ``ctx.add_cost``,
  so a ``max_cost`` budget stops a runaway agent before its next model request.
* **A model that is down** (rate limit, overload, 5xx, connection) is asked again under the
  same key, ``SAGAS_AGENT_MODEL_ATTEMPTS`` times with backoff; if it is still down, or wants a
  person (quota, credentials), the run parks as ``model_unavailable`` (nothing journaled for
  the turn, nothing compensated) and ``retry`` asks again. A request the model refuses as such
  (bad request, context window) fails the step like any step.
* **The conversation** (instructions, prompts, model messages, tool calls, tokens and cost per
  turn) is in the journal entries of those steps and nowhere else: a model turn's entry holds
  ``{"agent", "turn", "key", "model", "request": [messages new since the last turn],
  "response": message, "usage": {"input_tokens", "output_tokens"}, "cost", "priced"}``.

How it runs: pydantic-ai is asyncio and the journal is Django's synchronous ORM. The agent
runs on its own event loop in a helper thread; every journal operation is sent to the
workflow's own thread, which executes it (``ctx`` is never touched from the agent's thread)
and hands the value back. Tool calls run one at a time (``sequential``), so the journal's
order is the model's order of calls on every replay. A wait, a budget, a crash or a storage
failure on the workflow's thread abandons the agent's loop and leaves as it always does.

Limits: a tool must not call ``ctx`` itself (its work is the step); tools that touch the
database should be effect tools (a plain tool runs on the agent's thread or pydantic-ai's
thread pool, not in the workflow's transaction); streaming runs are not journaled.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from pydantic_core import to_jsonable_python

from ledger.errors import EffectFailed
from ledger.flow import spend
from sagas.agents.bridge import Bridge, journaled
from sagas.errors import ApprovalRejected, ModelUnavailable

# ToolDefinition.metadata key naming the connector of an effect tool.
CONNECTOR_KEY = "saga_connector"
# Rounds of deferred approvals one run_agent call goes through before giving up.
MAX_APPROVAL_ROUNDS = 20
APPROVAL_TIMEOUT = timedelta(hours=24)
# An agent's name labels journal entries and goes into HTTP headers (the request key): ASCII only.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,60}")

__all__ = ["CONNECTOR_KEY", "effect_tool", "model_cost", "run_agent"]


# --- declaring tools ----------------------------------------------------------------


def effect_tool(
    connector: str,
    *,
    name: str | None = None,
    description: str | None = None,
    max_retries: int | None = None,
) -> Callable[[Callable[..., dict]], Any]:
    """Make a pydantic-ai ``Tool`` whose call is a ledgered effect through ``connector``.

    The decorated function takes the model's arguments (its signature and docstring are the
    tool's schema and description, as for any pydantic-ai tool) and returns the connector's
    payload; the connector executes it under the effect's idempotency key, and its result is
    what the model sees. The connector's declared semantics (idempotent, lookup, compensate,
    irreversible) apply as they do to ``ctx.effect``::

        @effect_tool("payments.capture")
        def capture_payment(order: str, amount_cents: int, currency: str) -> dict:
            \"\"\"Capture the order's payment.\"\"\"
            return {"order": order, "amount_cents": amount_cents, "currency": currency}

        agent = Agent(model, tools=[capture_payment])
    """
    from pydantic_ai import Tool

    def wrap(fn: Callable[..., dict]) -> Any:
        return Tool(fn, name=name, description=description, max_retries=max_retries,
                    metadata={CONNECTOR_KEY: connector})

    return wrap


# --- model requests that fail for reasons of the model's side ---------------------------


class _ModelDown(Exception):
    """A model request failed ``attempts`` times for a reason that is not the request's own."""

    def __init__(self, cause: BaseException, attempts: int) -> None:
        super().__init__(str(cause))
        self.cause, self.attempts = cause, attempts


def _model_side(exc: BaseException) -> tuple[bool, bool]:
    """(transient, parks): a transient error is retried under the same key; one that persists,
    or needs a person (quota, credentials), parks the run instead of failing it. A request the
    model refuses as such (bad request, context window, unknown model) fails the step."""
    from pydantic_ai import exceptions as e

    from ledger.errors import Retryable, Timeout

    transient = (e.ModelRateLimitError, e.ModelUnavailableError, e.ModelServerError, e.ModelConnectionError,
                 ConnectionError, TimeoutError, Retryable, Timeout)
    if isinstance(exc, transient):
        return True, True
    return False, isinstance(exc, (e.ModelQuotaExceededError, e.ModelAuthenticationError))


def _retry_delay(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1`` of a model request: 0.5, 1, 2, 4, 8, 8..."""
    return min(0.5 * 2 ** (attempt - 1), 8.0)


async def _request(handler: Callable[[Any], Awaitable[Any]], request_context: Any) -> Any:
    """The model request; a failure of the model's side that outlived its attempts (made by
    ``on_model_request_error``) leaves as ``_ModelDown``, to park the run."""
    try:
        return await handler(request_context)
    except Exception as exc:
        transient, parks = _model_side(exc)
        if parks:
            raise _ModelDown(exc, _attempts() if transient else 1) from exc
        raise


def _attempts() -> int:
    return max(1, int(getattr(settings, "SAGAS_AGENT_MODEL_ATTEMPTS", 4)))


# --- cost -----------------------------------------------------------------------------


def model_cost(model_name: str, input_tokens: int, output_tokens: int) -> tuple[float, bool]:
    """(usd, priced) for one request: ``SAGAS_MODEL_PRICES[model]`` or ``["*"]`` gives usd per
    million input and output tokens; a model with no price costs 0 and says so."""
    prices: dict[str, Sequence[float]] = getattr(settings, "SAGAS_MODEL_PRICES", {}) or {}
    price = prices.get(model_name) or prices.get("*")
    if not price:
        return 0.0, False
    per_in, per_out = float(price[0]), float(price[1])
    return round((input_tokens * per_in + output_tokens * per_out) / 1_000_000, 8), True


# --- the capability that routes the agent through the journal -------------------------


def _dump_messages(messages: Sequence[Any]) -> list:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")


def _load_response(data: dict) -> Any:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.validate_python([data])[0]


def _dump_part(part: Any) -> dict:
    from pydantic_ai.messages import ModelRequest

    return _dump_messages([ModelRequest(parts=[part])])[0]["parts"][0]


def _load_part(data: dict) -> Any:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.validate_python([{"kind": "request", "parts": [data]}])[0].parts[0]


def _durability(ctx: Any, bridge: Bridge, label: str, turns: dict[str, int]) -> Any:
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import ModelRetry, RetryModelRequest, ToolRetryError

    class SagaDurability(AbstractCapability):
        """Model requests and tool calls of one ``run_agent`` as journal entries of ``ctx``."""

        async def wrap_model_request(self, run_ctx: Any, *, request_context: Any, handler: Any) -> Any:
            turn = turns["model"] = turns["model"] + 1
            key = f"{ctx.run_id}:{label}:turn-{turn}"
            settings_ = dict(request_context.model_settings or {})
            settings_["extra_headers"] = {**(settings_.get("extra_headers") or {}), "Idempotency-Key": key}
            request_context = replace(request_context, model_settings=settings_)
            new = request_context.messages[turns["sent"]:]

            async def work() -> dict:
                response = await _request(handler, request_context)
                usage = response.usage
                model = response.model_name or request_context.model.model_name
                cost, priced = model_cost(model, usage.input_tokens, usage.output_tokens)
                return {
                    "agent": label, "turn": turn, "key": key, "model": model,
                    "request": _dump_messages(new), "response": _dump_messages([response])[0],
                    "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
                    "cost": cost, "priced": priced,
                }

            def charged(runner: Callable[[], dict]) -> dict:
                ctx.check_spend(spend.MODEL)  # the turn is about to be sent for real: within the day's limit?
                try:
                    value = runner()
                except _ModelDown as exc:  # not the request's fault: park the run, journal nothing
                    raise ModelUnavailable(
                        f"model request {turn} of {label!r} failed {exc.attempts} times: {exc.cause}",
                        agent=label, turn=turn, key=key, error=type(exc.cause).__name__, attempts=exc.attempts,
                    ) from None
                # On the workflow's thread, recorded with this step: charged once, to the run's budget
                # and to its tenant's daily spend on "model".
                ctx.add_cost(value["cost"], connector=spend.MODEL)
                return value

            value = await journaled(bridge, lambda runner: ctx.step(f"{label}.model", charged, runner), work)
            turns["sent"] = len(request_context.messages) + 1
            return _load_response(value["response"])

        async def on_model_request_error(self, run_ctx: Any, *, request_context: Any, error: Exception) -> Any:
            # Inside the journaled request: another attempt under the same key, after a pause.
            attempt = getattr(request_context, "attempt", 1) or 1
            if _model_side(error)[0] and attempt < _attempts():
                await asyncio.sleep(_retry_delay(attempt))
                raise RetryModelRequest()
            raise error

        async def wrap_tool_execute(self, run_ctx: Any, *, call: Any, tool_def: Any, args: Any,
                                    handler: Any) -> Any:
            connector = (tool_def.metadata or {}).get(CONNECTOR_KEY)
            if connector:
                payload = await handler(args)  # the decorated function: the payload, no I/O
                try:
                    return await bridge.call(ctx.effect, call.tool_name, connector, payload)
                except ApprovalRejected as exc:
                    return {"status": "rejected", "message": str(exc)}
                except EffectFailed as exc:
                    return {"status": "failed", "message": str(exc)}

            async def work() -> dict:
                # A retry the tool asks for is the tool's answer to the model, journaled as such
                # (not a failed step), so a replay asks the model again in the same words.
                try:
                    return {"value": to_jsonable_python(await handler(args))}
                except ToolRetryError as exc:
                    return {"retry": _dump_part(exc.tool_retry)}
                except ModelRetry as exc:
                    return {"retry_message": exc.message}

            value = await journaled(
                bridge, lambda runner: ctx.step(f"{label}.tool.{call.tool_name}", runner), work)
            if "retry" in value:
                raise ToolRetryError(_load_part(value["retry"]))
            if "retry_message" in value:
                raise ModelRetry(value["retry_message"])
            return value["value"]

    return SagaDurability()


# --- running an agent ---------------------------------------------------------------


def run_agent(
    ctx: Any,
    agent: Any,
    prompt: str | Sequence[Any] | None,
    *,
    name: str = "agent",
    deps: Any = None,
    message_history: Sequence[Any] | None = None,
    model_settings: Any = None,
    approval_timeout: timedelta = APPROVAL_TIMEOUT,
) -> Any:
    """Run ``agent`` on ``prompt`` inside a workflow, durably, and return its output.

    ``name`` labels this agent's journal entries and keys (two agents in one workflow need
    two names). An approval-required tool waits for an approval named
    ``<name>.approve.<tool>`` (escalated after ``approval_timeout``). The run's own budgets
    apply: every model request and tool call is a step, and token cost is charged.
    """
    from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("name must be 1-60 letters, digits, '-' or '_'")
    bridge = Bridge()
    # Turns are numbered per run and name, across run_agent calls (a follow-up question to the
    # same agent continues the numbering), so no two requests of a run share a key.
    numbering: dict[str, int] = ctx.__dict__.setdefault("_agent_turns", {})
    turns = {"model": numbering.get(name, 0), "sent": 0}
    capability = _durability(ctx, bridge, name, turns)
    output_type = [agent.output_type, DeferredToolRequests]
    history = list(message_history or [])
    deferred = None
    for _round in range(MAX_APPROVAL_ROUNDS):
        async def main(
            prompt: str | Sequence[Any] | None = prompt, history: list[Any] = history, deferred: Any = deferred,
        ) -> Any:
            with agent.parallel_tool_call_execution_mode("sequential"):
                return await agent.run(
                    prompt, output_type=output_type, message_history=history or None,
                    deferred_tool_results=deferred, deps=deps, model_settings=model_settings,
                    capabilities=[capability],
                )

        try:
            result = bridge.serve(main)
        finally:
            numbering[name] = turns["model"]
        if not isinstance(result.output, DeferredToolRequests):
            return result.output
        if result.output.calls:
            names = ", ".join(c.tool_name for c in result.output.calls)
            raise ValueError(f"the agent deferred external tool calls ({names}); run_agent decides approvals only")
        approvals: dict[str, Any] = {}
        for call in result.output.approvals:
            reason = f"The agent asks to call {call.tool_name}({_args_text(call)})"
            try:
                decision = ctx.approval(f"{name}.approve.{call.tool_name}", reason=reason, timeout=approval_timeout)
            except ApprovalRejected as exc:
                approvals[call.tool_call_id] = ToolDenied(str(exc))
            else:
                approvals[call.tool_call_id] = True
                del decision
        history, deferred, prompt = result.all_messages(), DeferredToolResults(approvals=approvals), None
    raise RuntimeError(f"agent {name!r} asked for approvals more than {MAX_APPROVAL_ROUNDS} times")


def _args_text(call: Any, limit: int = 300) -> str:
    args = call.args_as_json_str() if hasattr(call, "args_as_json_str") else str(call.args)
    return args if len(args) <= limit else args[:limit] + "…"
