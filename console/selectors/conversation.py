"""A run's agent conversation (sagas/agents.py) as the run page shows it: one row per model turn.

What it reads, and nothing else: the journal entries of the run's agent steps (model turns
``<agent>.model[#n]`` and plain tool calls ``<agent>.tool.<tool>[#n]``), the ledger records of
its effect tools (``<tool>[#n]``) and its approvals (``<agent>.approve.<tool>[#n]`` for an
approval-required tool, ``approve:<tool>[#n]`` before an irreversible effect tool). Three
queries, whatever the number of turns (one when the run has no agent turns).

Which runs are read: ``run_conversation`` reads a run's conversation only if the newest page of
its history has an agent step, or the module of its workflow's definition mentions
``run_agent`` (one lookup by the versions table's unique index). So the page of a run that
runs no agent reads one page of its journal, not the whole of it. Not guaranteed: an agent run
from another module whose last agent step is older than the newest page shows no conversation.

How a tool call finds its entry, record and approval: the n-th call of tool X in the model's
responses (in journal order, skipping calls the model got a validation error for, which never
ran) is the n-th approval for X; the calls whose approval was rejected never ran, and among
the others the n-th is the n-th ``X`` effect or ``<agent>.tool.X`` entry. What the tool
returned is taken from the next request the model got (the ``tool-return``, or older
pydantic-ai's ``retry-prompt``, with the call's id), so it is what the model saw; a plain
tool's own entry stands in until then. Not guaranteed: a workflow that also calls
``ctx.effect("X")`` itself, outside the agent, or a tool that asks for approval only on some
calls, shifts that count for X.

Everything shown is redacted with the pages' policy (core/redaction.py) and cut to
``PREVIEW_CHARS`` characters; ``Shown.long`` tells the template to fold it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Q

from console.templatetags.payloads import PREVIEW_CHARS, SECRET_MARGIN, pruned  # the payload previews' own cut
from core.redaction import redact_json, redact_text
from ledger.models import EffectKind, EffectRecord
from operators.selectors.runs import HISTORY_PAGE_SIZE
from sagas.models import ApprovalRequest, ApprovalState, JournalEntry, WorkflowRun, WorkflowVersion

# Journal rows read for one page: model turns and plain tool calls together. A longer
# conversation shows its first turns and says so (the history has every entry). About 1.6 kB of
# HTML a turn (the demo's), so the region stays under console.live.PUSH_MAX_BYTES.
MAX_ENTRIES = 400
SUMMARY_CHARS = 100  # of a folded text, shown on its <summary> line

_AGENT = r"[A-Za-z0-9_-]{1,60}"
MODEL_NAME = re.compile(rf"^(?P<agent>{_AGENT})\.model(?:#[0-9]+)?$")
TOOL_NAME = re.compile(rf"^(?P<agent>{_AGENT})\.tool\.(?P<tool>[^#]+?)(?:#(?P<n>[0-9]+))?$")
AGENT_APPROVAL = re.compile(rf"^(?P<agent>{_AGENT})\.approve\.(?P<tool>[^#]+?)(?:#(?P<n>[0-9]+))?$")
GATE_APPROVAL = re.compile(r"^approve:(?P<tool>[^#]+?)(?:#(?P<n>[0-9]+))?$")
EFFECT_NAME = re.compile(r"^(?P<tool>[^#]+?)(?:#(?P<n>[0-9]+))?$")
# pydantic-ai's output tools (a structured output is the arguments of a call to one of them).
OUTPUT_TOOL = re.compile(r"^final_result(?:_.+)?$")
NOT_RUN = frozenset({ApprovalState.REJECTED, ApprovalState.EXPIRED})


@dataclass(frozen=True)
class Shown:
    """A redacted value as the page shows it: at most ``PREVIEW_CHARS`` characters of it
    (``cut``: there is more), folded when ``long``."""

    text: str
    long: bool
    cut: bool
    size: int

    @property
    def summary(self) -> str:
        line = self.text.strip().split("\n", 1)[0]
        return line if len(line) <= SUMMARY_CHARS else line[:SUMMARY_CHARS] + "…"


def shown_text(value: Any) -> Shown:
    """Free text: redacted (a secret that starts before the cut is masked whole), then cut."""
    whole = "" if value is None else str(value)
    text = redact_text(whole[: PREVIEW_CHARS + SECRET_MARGIN])
    cut = len(text) > PREVIEW_CHARS or len(whole) > PREVIEW_CHARS + SECRET_MARGIN
    return Shown(text[:PREVIEW_CHARS], cut, cut, len(whole))


def shown_json(value: Any) -> Shown:
    """A JSON value: redacted, indented, cut (only the part shown is redacted: see pruned)."""
    if isinstance(value, str):
        return shown_text(value)
    head, was_cut = pruned(value, PREVIEW_CHARS)
    text = redact_json(head)
    cut = was_cut or len(text) > PREVIEW_CHARS
    return Shown(text[:PREVIEW_CHARS], cut, cut, len(text))


@dataclass
class ToolCall:
    tool: str
    call_id: str
    args: Shown
    agent: str
    effect: EffectRecord | None = None
    approval: ApprovalRequest | None = None
    step_seq: int | None = None  # its plain tool entry
    outcome: str = ""  # "" (no answer yet), "returned", "retry", "denied", "failed", or pydantic-ai's
    result: Shown | None = None
    invalid: bool = False  # the model's arguments failed validation: the tool never ran

    @property
    def ran(self) -> bool:
        return not self.invalid and not (self.approval is not None and self.approval.state in NOT_RUN)


@dataclass
class Turn:
    seq: int
    number: int
    agent: str
    model: str = ""
    instructions: Shown | None = None
    prompts: list[Shown] = field(default_factory=list)  # system and user prompts sent with this turn
    texts: list[Shown] = field(default_factory=list)
    output: Shown | None = None  # a structured output (the output tool's arguments)
    calls: list[ToolCall] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    priced: bool = True
    error: Shown | None = None

    @property
    def cost_text(self) -> str:
        return usd(self.cost)


@dataclass
class Conversation:
    turns: list[Turn]
    more: bool  # only the first turns are shown
    agents: list[str]
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    unpriced: int = 0  # turns whose model has no price
    answered: int = 0  # turns with a response (a failed request has no usage)

    def __bool__(self) -> bool:
        return bool(self.turns)

    @property
    def cost_text(self) -> str:
        return usd(self.cost)


def usd(amount: float) -> str:
    """0.00012, 1.5, 0 (never 1.2E-4, never 0.00012000)."""
    return format(Decimal(str(round(amount, 8))).normalize(), "f")


def _content(part: dict) -> Any:
    return part.get("content")


def _prompt_text(content: Any) -> Any:
    """A user prompt is a string or a list of strings and media; media shown as their kind."""
    if isinstance(content, list):
        return "\n".join(c if isinstance(c, str) else f"[{(c or {}).get('kind', 'attachment')}]" for c in content)
    return content


def _args(value: Any) -> Any:
    """Tool arguments as the model gave them: a dict, or a JSON string (parsed, so that their
    keys are redacted by name), or a string that is not JSON (shown as text)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _turn(entry: JournalEntry, number: int, agent: str, first_of_agent: bool) -> tuple[Turn, list[dict]]:
    """The turn of a model entry, and the request parts it carried (tool returns land on the
    calls of earlier turns)."""
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    turn = Turn(seq=entry.seq, number=number, agent=agent)
    if "error" in payload or not isinstance(payload.get("value"), dict):
        err = payload.get("error") or {}
        turn.error = shown_text(f"{err.get('type', 'Error')}: {err.get('message', '')}")
        turn.priced = True
        return turn, []
    value = payload["value"]
    turn.number = int(value.get("turn") or number)
    turn.model = str(value.get("model") or "")
    usage = value.get("usage") or {}
    turn.input_tokens = int(usage.get("input_tokens") or 0)
    turn.output_tokens = int(usage.get("output_tokens") or 0)
    turn.cost = float(value.get("cost") or 0)
    turn.priced = bool(value.get("priced", True))
    returns: list[dict] = []
    for message in value.get("request") or []:
        if not isinstance(message, dict):
            continue
        if first_of_agent and message.get("instructions"):
            turn.instructions = shown_text(message["instructions"])
        for part in message.get("parts") or []:
            kind = part.get("part_kind") if isinstance(part, dict) else None
            if kind == "system-prompt":
                turn.prompts.append(shown_text(_content(part)))
            elif kind == "user-prompt":
                turn.prompts.append(shown_text(_prompt_text(_content(part))))
            elif kind in ("tool-return", "retry-prompt"):
                returns.append(part)
    response = value.get("response") or {}
    for part in response.get("parts") or []:
        kind = part.get("part_kind") if isinstance(part, dict) else None
        if kind == "text" and part.get("content"):
            turn.texts.append(shown_text(part["content"]))
        elif kind == "tool-call" and OUTPUT_TOOL.match(str(part.get("tool_name") or "")):
            turn.output = shown_json(_args(part.get("args")))
        elif kind == "tool-call":
            args = _args(part.get("args"))
            turn.calls.append(ToolCall(
                tool=str(part.get("tool_name") or ""), call_id=str(part.get("tool_call_id") or ""),
                args=shown_json(args if args is not None else {}), agent=agent))
    return turn, returns


def _answer(call: ToolCall, part: dict) -> None:
    """What the model got back for ``call``."""
    content = _content(part)
    outcome = str(part.get("outcome") or "success")
    if part.get("part_kind") == "retry-prompt" or outcome == "retried":
        call.outcome = "retry"
        retry = part.get("retry")
        cause = retry.get("cause") if isinstance(retry, dict) else None
        # Arguments that failed validation: the tool was not called (a ModelRetry from the tool: it was).
        call.invalid = cause == "validation_error" if cause else isinstance(content, list)
        call.result = shown_json(content)
        return
    call.outcome = "returned" if outcome == "success" else outcome
    if isinstance(content, dict) and set(content) == {"status", "message"} \
            and content["status"] in ("rejected", "failed"):
        call.outcome = str(content["status"])  # sagas.agents' answer for a rejected or failed effect
    call.result = shown_json(content)


def _numbered(match: re.Match[str]) -> int:
    return int(match.group("n") or 1)


def is_agent_step(name: str) -> bool:
    return bool(MODEL_NAME.match(name) or TOOL_NAME.match(name))


def runs_agents(run: WorkflowRun, newest_names: Iterable[str] | None = None,
                *, page: int = HISTORY_PAGE_SIZE) -> bool:
    """Whether ``run`` may have a conversation (module docstring). ``newest_names``: the names of
    the newest ``page`` entries, if the caller has them (else they are read)."""
    if newest_names is None:
        newest_names = JournalEntry.objects.filter(run_id=run.id).order_by("-seq") \
            .values_list("name", flat=True)[:page]
    if any(is_agent_step(name) for name in newest_names):
        return True
    return WorkflowVersion.objects.filter(name=run.workflow_name, version=run.version,
                                          definition_hash=run.definition_hash,
                                          source__contains="run_agent").exists()


def run_conversation(run: WorkflowRun, newest_names: Iterable[str] | None = None) -> Conversation:
    """``conversation(run.id)`` if ``runs_agents``, else an empty one."""
    if not runs_agents(run, newest_names):
        return Conversation(turns=[], more=False, agents=[])
    return conversation(run.id)


def conversation(run_id: Any, *, max_entries: int = MAX_ENTRIES) -> Conversation:
    """The run's agent conversation (empty when it has none); see the module docstring."""
    entries = list(
        JournalEntry.objects.filter(run_id=run_id, kind="step")
        .filter(Q(name__contains=".model") | Q(name__contains=".tool."))  # LIKE: cheaper than a regex per row
        .order_by("seq").only("seq", "name", "payload")[: max_entries + 1]
    )
    more = len(entries) > max_entries
    entries = entries[:max_entries]

    turns: list[Turn] = []
    agents: list[str] = []
    calls_by_id: dict[str, ToolCall] = {}
    plain: dict[tuple[str, str, int], JournalEntry] = {}
    for entry in entries:
        model = MODEL_NAME.match(entry.name)
        if model:
            agent = model.group("agent")
            payload = entry.payload if isinstance(entry.payload, dict) else {}
            if "value" in payload and not (isinstance(payload["value"], dict) and "response" in payload["value"]):
                continue  # a step of the workflow's own that happens to be called "x.model"
            first = agent not in agents
            if first:
                agents.append(agent)
            turn, returns = _turn(entry, sum(t.agent == agent for t in turns) + 1, agent, first)
            for part in returns:
                call = calls_by_id.get(f"{agent}\0{part.get('tool_call_id')}")
                if call is not None:
                    _answer(call, part)
            for call in turn.calls:
                calls_by_id[f"{agent}\0{call.call_id}"] = call
            turns.append(turn)
            continue
        tool = TOOL_NAME.match(entry.name)
        if tool:
            plain[(tool.group("agent"), tool.group("tool"), _numbered(tool))] = entry
    if not turns:
        return Conversation(turns=[], more=False, agents=[])

    result = Conversation(turns=turns, more=more, agents=agents)
    for turn in turns:
        result.input_tokens += turn.input_tokens
        result.output_tokens += turn.output_tokens
        result.cost += turn.cost
        result.unpriced += 0 if turn.priced or turn.error else 1
        result.answered += 0 if turn.error else 1
    calls = [c for t in turns for c in t.calls if not c.invalid]
    if not calls:
        return result
    by_tool: dict[str, list[ToolCall]] = defaultdict(list)
    by_agent_tool: dict[tuple[str, str], list[ToolCall]] = defaultdict(list)
    for call in calls:
        by_tool[call.tool].append(call)
        by_agent_tool[(call.agent, call.tool)].append(call)

    # Approvals: the n-th of a tool is its n-th call's.
    names = [f"{a}.approve.{t}" for (a, t) in by_agent_tool] + [f"approve:{t}" for t in by_tool]
    approvals = ApprovalRequest.objects.filter(run_id=run_id).filter(step__regex=_names_regex(names)) \
        .defer("reason").order_by("id")
    for approval in approvals:
        found = AGENT_APPROVAL.match(approval.step)
        group = by_agent_tool.get((found.group("agent"), found.group("tool"))) if found else None
        if group is None:
            found = GATE_APPROVAL.match(approval.step)
            group = by_tool.get(found.group("tool")) if found else None
        if group and found and _numbered(found) <= len(group):
            group[_numbered(found) - 1].approval = approval

    # Effects and plain entries: the n-th of a tool is the n-th of its calls that ran.
    effects = EffectRecord.objects.filter(run_id=run_id, kind=EffectKind.EFFECT,
                                          step_name__regex=_names_regex(list(by_tool))) \
        .only("id", "run_id", "step_name", "status", "connector").order_by("id")
    ran_by_tool = {tool: [c for c in group if c.ran] for tool, group in by_tool.items()}
    for effect in effects:
        found = EFFECT_NAME.match(effect.step_name)
        group = ran_by_tool.get(found.group("tool")) if found else None
        if group and found and _numbered(found) <= len(group):
            group[_numbered(found) - 1].effect = effect
    for (agent_name, tool_name), group in by_agent_tool.items():
        for n, call in enumerate((c for c in group if c.ran), start=1):
            step = plain.get((agent_name, tool_name, n))
            if step is None:
                continue
            call.step_seq = step.seq
            if call.outcome:
                continue  # the model's answer is what it saw
            payload = step.payload if isinstance(step.payload, dict) else {}
            value = payload.get("value")
            if "error" in payload:
                err = payload["error"] or {}
                call.outcome = "failed"
                call.result = shown_text(f"{err.get('type', 'Error')}: {err.get('message', '')}")
            elif isinstance(value, dict) and "retry" in value:
                call.outcome, call.result = "retry", shown_text(value["retry"])
            elif isinstance(value, dict):
                call.outcome, call.result = "returned", shown_json(value.get("value"))
    return result


def _names_regex(bases: list[str]) -> str:
    """A PostgreSQL regex matching ``base`` and ``base#n`` for each of ``bases`` (not empty)."""
    return "^(" + "|".join(re.escape(b) for b in sorted(set(bases))) + ")(#[0-9]+)?$"
