"""The bridge between a pydantic-ai agent's event loop and the workflow's thread (``sagas.agents``).

pydantic-ai is asyncio; the journal is Django's synchronous ORM, used from the workflow's own
thread. ``Bridge.serve`` runs the agent on a fresh event loop in a helper thread and executes,
on the workflow's thread, every journal call the agent sends with ``Bridge.call``; ``ctx`` is
never touched from the agent's thread. ``journaled`` runs a unit of agent work (a model
request, a tool) inside ``ctx.step``/``ctx.effect`` while the work itself stays in the agent's
task, with its context. A wait, a budget, a crash point or a storage failure on the workflow's
thread abandons the agent's loop and leaves as the engine expects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# How long the workflow's thread waits for an abandoned agent loop to unwind.
UNWIND_TIMEOUT_S = 10.0

class _Abandoned(BaseException):
    """Thrown into the agent's loop when the workflow's thread stopped serving it (a wait,
    a budget, a crash of storage): the agent unwinds and nothing more is journaled."""


@dataclass
class Bridge:
    """Journal calls from the agent's thread, executed on the workflow's thread."""

    requests: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the workflow's thread and return its value (or raise its
        ``Exception``) here. The only way agent code reaches ``ctx``."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()
        self.requests.put((fn, args, loop, answer))
        return await answer

    def serve(self, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``main()`` on a fresh event loop in a helper thread, and serve its journal
        calls here until it ends; its value or exception is this call's."""
        outcome: dict[str, Any] = {}
        done = object()

        def loop_thread() -> None:
            try:
                outcome["value"] = asyncio.run(main())
            except BaseException as exc:  # any: handed to the workflow's thread
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


async def journaled(bridge: Bridge, record: Callable[[Callable[[], Any]], Any],
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
