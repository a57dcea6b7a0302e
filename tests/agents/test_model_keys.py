"""Every model request of a run carries its own Idempotency-Key, so a gateway that honours
keys answers each request for itself and bills it once."""

from __future__ import annotations

import pytest

from demo.providers.selectors import executions
from sagas import start
from sagas.models import RunStatus
from tests.agents import wf_agents  # noqa: F401  (registers agent_follow_up here too)
from tests.agents.runs import billed, cached, script, wait_finished

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_gives_each_request_its_own_key_when_one_agent_is_asked_twice_in_a_run(stack):
    run = start("agent_follow_up", {"script": script("Nothing else to do for o-1.")})
    stack.worker("w1")
    run = wait_finished(run)
    assert run.status == RunStatus.COMPLETED, (
        "BUG in sagas/agents.py (reported to the lead): a second run_agent call with the same name "
        "numbers its turns from 1 again, so its first request reuses the key '<run>:agent:turn-1' of the "
        "first call. The demo gateway refuses the reused key with another body (the run fails); a "
        "gateway that caches by key alone would silently answer the follow-up with the first answer. "
        f"Run error: {run.error}"
    )
    keys = list(executions("model", "complete").values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys)) == 2, keys
    assert (billed(), cached()) == (2, 0)
    assert run.result["first"].startswith("Nothing else") and run.result["second"].startswith("Nothing else")
