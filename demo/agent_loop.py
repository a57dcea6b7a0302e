"""The demo's long agent loop: a stock watcher that never finishes on its own.

Each turn, a pydantic-ai agent with the demo's scripted model (``FunctionModel``: no LLM, no
network) reads one shelf's stock level and answers ``reorder <sku>`` or ``ok <sku>``. A real
watcher would run for weeks; one run holding every turn would journal (and replay on every
claim) its whole history. So the workflow calls ``ctx.continue_as_new`` every 200 turns
(``TURNS_PER_RUN``): the next run starts with the counts so far as its input, and an empty
journal. The console shows the runs as one chain; the cost budget (``max_cost``) is the chain's.

Registered by ``demo.apps`` (this module is imported when Django starts, so every process has
it); pydantic-ai is imported only when a turn runs.

Input: ``{"store": "leeds"}``; optional ``turns`` (stop after that many, for the tests and
``make demo``; absent: watch for ever), ``every`` (turns per run).
"""

from __future__ import annotations

from typing import Any

from sagas import Context, workflow

TURNS_PER_RUN = 200
AGENT_NAME = "watch"
MODEL_NAME = "demo-order-model"  # the demo's priced model (SAGAS_MODEL_PRICES), so turns cost a little
SHELVES = ("SKU-KETTLE", "SKU-LAMP", "SKU-CHAIR", "SKU-BOOK", "SKU-MUG")
REORDER_BELOW = 20  # percent of a shelf's capacity


def shelf_reading(turn: int) -> tuple[str, int]:
    """The shelf the watcher reads at ``turn`` and its level in percent (deterministic)."""
    return SHELVES[turn % len(SHELVES)], (turn * 37 + 11) % 100


def watch_prompt(store: str, turn: int) -> str:
    sku, level = shelf_reading(turn)
    return f"Store {store}, turn {turn}: shelf {sku} is at {level}% of capacity. Reorder below {REORDER_BELOW}%."


def _script(messages: list[Any], info: Any) -> Any:
    """The scripted model: reads the level from the prompt and answers in one line."""
    from pydantic_ai.messages import ModelResponse, TextPart, UserPromptPart
    from pydantic_ai.usage import RequestUsage

    prompt = next(part.content for message in messages for part in getattr(message, "parts", [])
                  if isinstance(part, UserPromptPart) and isinstance(part.content, str))
    sku = prompt.split("shelf ", 1)[1].split(" ", 1)[0]
    level = int(prompt.split(" is at ", 1)[1].split("%", 1)[0])
    answer = f"reorder {sku}" if level < REORDER_BELOW else f"ok {sku}"
    usage = RequestUsage(input_tokens=max(1, len(prompt) // 4), output_tokens=3)
    return ModelResponse(parts=[TextPart(answer)], usage=usage, model_name=MODEL_NAME)


def make_watch_agent() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    return Agent(FunctionModel(_script, model_name=MODEL_NAME), name="stock_watch", output_type=str,
                 instructions="You watch a store's shelves. Answer 'reorder <sku>' or 'ok <sku>'.")


@workflow("stock_watch", version=1, max_cost=5.0, summary=["store"])
def stock_watch(ctx: Context, state: dict) -> dict:
    """One model turn per shelf reading; continues as new every ``every`` turns (200)."""
    from sagas.agents import run_agent

    agent = make_watch_agent()
    store, end, every = state["store"], state.get("turns"), state.get("every", TURNS_PER_RUN)
    turn, reorders = state.get("turn", 0), state.get("reorders", 0)
    last = state.get("last", "")
    for _ in range(every):
        if end is not None and turn >= end:
            break
        last = run_agent(ctx, agent, watch_prompt(store, turn), name=AGENT_NAME)
        reorders += last.startswith("reorder")
        turn += 1
    if end is not None and turn >= end:
        return {"store": store, "turns": turn, "reorders": reorders, "last": last}
    return ctx.continue_as_new({**state, "turn": turn, "reorders": reorders, "last": last})
