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
import concurrent.futures
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from pydantic_core import to_jsonable_python

from ledger.errors import EffectFailed
from sagas.errors import ApprovalRejected

T = TypeVar("T")

# ToolDefinition.metadata key naming the connector of an effect tool.
CONNECTOR_KEY = "saga_connector"
# Rounds of deferred approvals one run_agent call goes through before giving up.
MAX_APPROVAL_ROUNDS = 20
APPROVAL_TIMEOUT = timedelta(hours=24)
# How long the workflow's thread waits for an abandoned agent loop to unwind.
UNWIND_TIMEOUT_S = 10.0

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


# --- the bridge between the agent's loop and the workflow's thread --------------------


class _Abandoned(BaseException):
    """Thrown into the agent's loop when the workflow's thread stopped serving it (a wait,
    a budget, a crash of storage): the agent unwinds and nothing more is journaled."""


@dataclass
class _Bridge:
    """Journal calls from the agent's thread, executed on the workflow's thread."""

    requests: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the workflow's thread and return its value (or raise its
        ``Exception``) here. The only way agent code reaches ``ctx``."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()
        self.requests.put((fn, args, loop, answer))
        return await answer

    def serve(self, main: Callable[[], Awaitable[T]]) -> T:
        """Run ``main()`` on a fresh event loop in a helper thread, and serve its journal
        calls here until it ends; its value or exception is this call's."""
        outcome: dict[str, Any] = {}
        done = object()

        def loop_thread() -> None:
            try:
                outcome["value"] = asyncio.run(main())
            except BaseException as exc:  # noqa: BLE001 (handed to the workflow's thread)
                outcome["error"] = exc
            finally:
                self.requests.put(done)

        thread = threading.Thread(target=loop_thread, name="saga-agent-loop", daemon=True)
        thread.start()
        while True:
            item = self.requests.get()
            if item is done:
                break
            fn, args, loop, answer = item
            try:
                value = fn(*args)
            except Exception as exc:  # the workflow-visible kind: the agent may handle it
                loop.call_soon_threadsafe(_settle, answer, None, exc)
            except BaseException:
                # The engine's (Suspend, BudgetExceeded, StorageUnavailable, LeaseLost, a
                # crash point...): stop the agent, then leave as the engine expects.
                loop.call_soon_threadsafe(_settle, answer, None, _Abandoned())
                self._drain(done, thread)
                raise
            else:
                loop.call_soon_threadsafe(_settle, answer, value, None)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _drain(self, done: object, thread: threading.Thread) -> None:
        """Refuse whatever the unwinding agent still asks for, until its loop has ended."""
        while thread.is_alive() or not self.requests.empty():
            try:
                item = self.requests.get(timeout=UNWIND_TIMEOUT_S)
            except queue.Empty:
                return  # a tool ignoring cancellation: the daemon thread is left behind
            if item is done:
                return
            _fn, _args, loop, answer = item
            loop.call_soon_threadsafe(_settle, answer, None, _Abandoned())


def _settle(answer: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value)


async def _journaled(bridge: _Bridge, record: Callable[[Callable[[], Any]], Any],
                     work: Callable[[], Awaitable[Any]]) -> Any:
    """``record(runner)`` runs on the workflow's thread (``ctx.step``/``ctx.effect`` around
    ``runner``); when the journal has no entry yet, ``runner`` asks this task to do ``work()``
    and blocks the workflow's thread until it is done. So the work runs here, in the agent's
    task with its context, and its value is journaled there before it is returned."""
    loop = asyncio.get_running_loop()
    go = asyncio.Event()
    result: concurrent.futures.Future = concurrent.futures.Future()

    def runner() -> Any:
        loop.call_soon_threadsafe(go.set)
        return result.result()

    recorded = asyncio.ensure_future(bridge.call(record, runner))
    asked = asyncio.ensure_future(go.wait())
    try:
        await asyncio.wait({recorded, asked}, return_when=asyncio.FIRST_COMPLETED)
        if asked.done() and not recorded.done():
            try:
                result.set_result(await work())
            except Exception as exc:
                result.set_exception(exc)
            except BaseException as exc:
                result.set_exception(exc)
                raise
        return await recorded
    finally:
        asked.cancel()


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


def _durability(ctx: Any, bridge: _Bridge, label: str, turns: dict[str, int]) -> Any:
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import ModelRetry, ToolRetryError

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
                response = await handler(request_context)
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
                value = runner()
                ctx.add_cost(value["cost"])  # on the workflow's thread, recorded with this step: charged once
                return value

            value = await _journaled(bridge, lambda runner: ctx.step(f"{label}.model", charged, runner), work)
            turns["sent"] = len(request_context.messages) + 1
            return _load_response(value["response"])

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

            value = await _journaled(
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

    if not name or len(name) > 60 or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError("name must be 1-60 letters, digits, '-' or '_'")
    bridge = _Bridge()
    # Turns are numbered per run and name, across run_agent calls (a follow-up question to the
    # same agent continues the numbering), so no two requests of a run share a key.
    numbering: dict[str, int] = ctx.__dict__.setdefault("_agent_turns", {})
    turns = {"model": numbering.get(name, 0), "sent": 0}
    capability = _durability(ctx, bridge, name, turns)
    output_type = [agent.output_type, DeferredToolRequests]
    history = list(message_history or [])
    deferred = None
    for _round in range(MAX_APPROVAL_ROUNDS):
        async def main(prompt=prompt, history=history, deferred=deferred) -> Any:
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
