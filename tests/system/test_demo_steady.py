"""``make demo`` over a long day (issue 39 point 7): thirty passes of the story against a running
stack reach a steady state: the requests waiting for a decision, the unresolved operations and
the open tasks stay bounded, whether or not people act; what people settle, the agent closes.
The demo-agent token `make run` prints sees the story's work."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from agent_console_client import Client

from console.management.commands.demo import (
    DEMO_AGENT,
    OPEN_NOTICES,
    OPEN_REFUNDS,
    Story,
    story_pass,
)
from runtime.models import Approval, Operation, Task
from runtime.rules.statuses import TaskCondition
from runtime.tokens import token_issue_for_agent
from tests import factories
from tests.conftest import server_start

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

PASSES = 30


def _counts() -> dict[str, int]:
    story = Task.objects.filter(agent__name=DEMO_AGENT)
    return {
        "pending": Approval.objects.filter(status="pending").count(),
        "unresolved": Operation.objects.filter(status="unresolved").count(),
        "runnable": story.filter(condition=TaskCondition.RUNNABLE).count(),
        "open": story.exclude(condition=TaskCondition.TERMINAL).count(),
    }


def _people_act(operator: factories.Principal, support: factories.Principal) -> None:
    """A shift's work: every waiting refund approved, every unresolved notice settled."""
    for approval in Approval.objects.filter(status="pending"):
        answer = operator.client().post(
            f"/api/v1/approvals/{approval.pk}/decision",
            {"decision": "approve", "reason": "ok", "params_hash": approval.params_hash},
            format="json",
        )
        assert answer.status_code == 200, answer.content
    for op in Operation.objects.filter(status="unresolved"):
        answer = support.client().post(
            f"/api/v1/operations/{op.pk}/resolve",
            {
                "resolution": "succeeded",
                "evidence": "the customer confirmed by phone",
                "state_version": op.state_version,
            },
            format="json",
        )
        assert answer.status_code == 200, answer.content


def test_thirty_demo_passes_stay_bounded_and_the_printed_token_sees_them(workers, tmp_path: Path):
    printed = token_issue_for_agent(DEMO_AGENT).secret  # as runstack's demo accounts print it
    operator, support = factories.console_user("operator"), factories.console_user("support")
    server = server_start(tmp_path)
    seen: list[dict[str, int]] = []
    try:
        workers.start(concurrency=2, RETRY_BASE_SECONDS="0.2")
        story = Story()
        token = token_issue_for_agent(DEMO_AGENT).secret
        with Client(base_url=server.url, token=token) as console:
            for n in range(1, PASSES + 1):
                story_pass(console, n, timeout=60, story=story)
                seen.append(_counts())
                if n in (10, 20):
                    _people_act(operator, support)
        listed = httpx.get(
            f"{server.url}/api/v1/tasks",
            headers={"Authorization": f"Bearer {printed}"},
            params={"q": "refund order"},
            timeout=30,
        )
    finally:
        server.stop()
    bounds = {
        "pending": OPEN_REFUNDS,
        "unresolved": OPEN_NOTICES,
        "runnable": OPEN_REFUNDS + OPEN_NOTICES + 2,
        "open": OPEN_REFUNDS + OPEN_NOTICES + 2,
    }
    for n, counts in enumerate(seen, 1):
        assert all(counts[k] <= bound for k, bound in bounds.items()), (n, counts, bounds)
    # People acted twice, and the agent closed what they settled: new work came after.
    closed = Task.objects.filter(agent__name=DEMO_AGENT, condition=TaskCondition.TERMINAL)
    assert closed.filter(name__startswith="refund order", outcome="succeeded").count() >= 2 * 2
    assert closed.filter(name__startswith="tell the customer").count() >= 2
    assert listed.status_code == 200, listed.text
    names = {t["name"] for t in listed.json()["results"]}
    assert any(name.startswith("refund order") for name in names), sorted(names)[:5]
