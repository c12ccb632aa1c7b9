"""One rule, two renderings: each row of the claim table (runtime.rules.claim) and of the
general-writer table (runtime.rules.general_writer) is evaluated in Python over a claim's facts
and, rendered as the statements render it, in SQL over the real operation and task rows holding
those facts; over a grid of states both answer alike, row by row. The general claim's order of
refusals, and what each settles to, are pinned with it."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from runtime.models import Operation, Task
from runtime.rules import claim, general_writer
from runtime.rules.claim import CLAIM_RULES, ClaimFacts, Settles, ToolSupport, claim_refusal
from runtime.rules.general_writer import FastFacts, general_writer_needed
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition
from tests import factories

pytestmark = [pytest.mark.postgres]

S = OperationStatus
TOOL = "demo.echo"


@dataclass(frozen=True)
class _Adapter:
    version: str
    supported: tuple[str, ...]

    def supports(self, recorded_version: str) -> bool:
        return recorded_version in self.supported


def _states(n: int, seed: int = 35) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now = timezone.now()
    times = [None, now - timedelta(seconds=5), now, now + timedelta(seconds=5)]
    states = []
    for _ in range(n):
        max_attempts = rng.choice([1, 3])
        states.append(
            {
                "status": rng.choice(S.ALL),
                "executor": rng.choice(["worker", "agent"]),
                "claimant": rng.choice(["worker", "agent"]),
                "next_attempt_at": rng.choice(times),
                "attempts_used": rng.randint(0, max_attempts),
                "max_attempts": max_attempts,
                "approval_required": rng.random() < 0.3,
                "op_deadline": rng.choice(times),
                "task_deadline": rng.choice(times),
                "cancellation": rng.choice(Cancellation.ALL),
                "condition": rng.choice(TaskCondition.ALL),
                "paused": rng.random() < 0.3,
                "tool_version": rng.choice(["1", "2"]),
                "adapter": rng.choice([None, ("2", ("1", "2")), ("2", ("2",))]),
                "compensation": rng.random() < 0.3,
                "budget": rng.choice([{}, {"cost": 10}]),
                "now": now,
            }
        )
    return states


def _facts(state: dict[str, Any]) -> ClaimFacts:
    adapter = None if state["adapter"] is None else _Adapter(*state["adapter"])
    return ClaimFacts(
        status=state["status"],
        executor=state["executor"],
        claimant=state["claimant"],
        next_attempt_at=state["next_attempt_at"],
        attempts_used=state["attempts_used"],
        max_attempts=state["max_attempts"],
        approval_required=state["approval_required"],
        deadline=state["op_deadline"] or state["task_deadline"],
        cancellation=state["cancellation"],
        condition=state["condition"],
        paused=state["paused"],
        tool=TOOL,
        tool_version=state["tool_version"],
        now=state["now"],
        adapter=lambda: (
            None
            if adapter is None
            else ToolSupport(adapter.version, adapter.supports(state["tool_version"]))
        ),
    )


def _supported(state: dict[str, Any]) -> list[str]:
    """The ``tool:version`` list a claimant with this adapter passes to the statement."""
    if state["adapter"] is None:
        return []
    return [f"{TOOL}:{v}" for v in state["adapter"][1]]


@pytest.mark.django_db
def test_each_claim_rule_and_general_writer_case_answers_alike_in_python_and_sql():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool=TOOL)
    original = factories.operation(owner, task, tool=TOOL)
    cases = [c for c in general_writer.GENERAL_WRITER_CASES if c.sql_forms]
    columns = [
        rule.sql.format(executor="%(executor)s", supported="%(supported)s", now="%(now)s")
        for rule in CLAIM_RULES
    ] + [c.sql for c in cases]
    select = (
        "SELECT "
        + ",\n  ".join(f"({c}) IS TRUE" for c in columns)
        + "\nFROM runtime_operation o JOIN runtime_task t ON t.id = o.task_id WHERE o.id = %(id)s"
    )
    checked = 0
    for state in _states(400):
        Operation.objects.filter(pk=op.pk).update(
            status=state["status"],
            executor=state["executor"],
            next_attempt_at=state["next_attempt_at"],
            attempts_used=state["attempts_used"],
            max_attempts=state["max_attempts"],
            approval_required=state["approval_required"],
            deadline=state["op_deadline"],
            tool_version=state["tool_version"],
            compensates_id=original.pk if state["compensation"] else None,
        )
        Task.objects.filter(pk=task.pk).update(
            cancellation=state["cancellation"],
            condition=state["condition"],
            paused=state["paused"],
            deadline=state["task_deadline"],
            budget=state["budget"],
        )
        with connection.cursor() as cur:
            cur.execute(
                select,
                {
                    "id": op.pk,
                    "executor": state["claimant"],
                    "supported": _supported(state),
                    "now": state["now"],
                },
            )
            in_sql = list(cur.fetchone())
        facts = _facts(state)
        in_python = [rule.admits(facts) for rule in CLAIM_RULES]
        fast = FastFacts(
            compensates_id=original.pk if state["compensation"] else None,
            attempts_used=state["attempts_used"],
            budget=functools.partial(dict, state["budget"]),
        )
        in_python += [not c.needed(fast) for c in cases]
        names = [r.code for r in CLAIM_RULES] + [c.code for c in cases]
        assert dict(zip(names, in_sql, strict=True)) == dict(zip(names, in_python, strict=True)), (
            state
        )
        checked += 1
    assert checked == 400


def test_every_row_settles_to_a_known_outcome_and_the_order_is_the_general_claims():
    outcomes = {v for k, v in vars(Settles).items() if not k.startswith("_")}
    assert {rule.outcome for rule in CLAIM_RULES} <= outcomes
    assert [rule.code for rule in CLAIM_RULES] == [
        "claimable",
        "executor",
        "due",
        "stopping",
        "paused",
        "deadline",
        "version",
        "attempts",
        "approval",
    ]
    # What a compensation is not refused by: its task's stop, pause and deadline.
    assert [r.code for r in CLAIM_RULES if r.cleanup_exempt] == ["stopping", "paused", "deadline"]


def test_the_first_refusing_row_decides_and_a_compensation_passes_the_stop():
    now = timezone.now()
    state = _states(1)[0] | {
        "status": S.PENDING,
        "executor": "worker",
        "claimant": "worker",
        "next_attempt_at": None,
        "attempts_used": 0,
        "max_attempts": 3,
        "approval_required": False,
        "op_deadline": now - timedelta(seconds=1),
        "task_deadline": None,
        "cancellation": Cancellation.REQUESTED,
        "condition": TaskCondition.RUNNING,
        "paused": True,
        "tool_version": "2",
        "adapter": ("2", ("2",)),
        "now": now,
    }
    facts = _facts(state)
    refused = claim_refusal(facts, cleanup=False)
    assert refused is not None and refused.outcome == Settles.STOP
    assert claim_refusal(facts, cleanup=True) is None
    facts = _facts(state | {"cancellation": Cancellation.NONE, "op_deadline": None})
    refused = claim_refusal(facts, cleanup=False)
    assert refused is not None and refused.outcome == Settles.REFUSE_PAUSED
    missing = _facts(state | {"cancellation": "none", "paused": False, "adapter": None})
    refused = claim_refusal(missing, cleanup=False)
    assert refused is not None and refused.code == "deadline"
    missing = _facts(state | {"cancellation": "none", "paused": False, "op_deadline": None})
    assert claim_refusal(missing, cleanup=False) is None
    gone = _facts(
        state | {"cancellation": "none", "paused": False, "op_deadline": None, "adapter": None}
    )
    refused = claim_refusal(gone, cleanup=False)
    assert refused is not None and refused.code == "version"
    assert refused.reason(gone).endswith("(tool missing)")


def test_the_rows_read_again_under_the_task_lock_are_the_tables_own_and_answer_as_it_does():
    """The claim's second look at the task row (after its lock) asks the table's own rows, so a
    row changed in the table changes that look too; over every task state the two agree."""
    assert set(claim.UNDER_TASK_LOCK) <= {rule.code for rule in CLAIM_RULES}
    now = timezone.now()
    base = _states(1)[0] | {
        "status": S.PENDING,
        "executor": "worker",
        "claimant": "worker",
        "next_attempt_at": None,
        "attempts_used": 0,
        "max_attempts": 3,
        "approval_required": False,
        "op_deadline": None,
        "task_deadline": None,
        "tool_version": "2",
        "adapter": ("2", ("2",)),
        "now": now,
    }
    for cancellation in (Cancellation.NONE, Cancellation.REQUESTED, Cancellation.ACKNOWLEDGED):
        for condition in (TaskCondition.RUNNING, TaskCondition.TERMINAL):
            for paused in (False, True):
                for cleanup in (False, True):
                    state = base | {
                        "cancellation": cancellation,
                        "condition": condition,
                        "paused": paused,
                    }
                    facts = _facts(state)
                    whole = claim_refusal(facts, cleanup=cleanup)
                    again = claim.task_lock_refusal(facts, cleanup=cleanup)
                    assert again == whole, (cancellation, condition, paused, cleanup)
    stopped = _facts(base | {"cancellation": Cancellation.REQUESTED, "paused": True})
    assert (claim.task_lock_refusal(stopped, cleanup=False) or CLAIM_RULES[0]).code == "stopping"


def test_the_general_writer_is_asked_by_form_and_its_sql_renders_per_form():
    budgeted = FastFacts(attempts_used=1, budget=lambda: {"cost": 1})
    assert general_writer_needed("claim", budgeted) == "ledger_redispatch"
    assert general_writer_needed("claim", FastFacts(budget=lambda: {"cost": 1})) is None
    assert general_writer_needed("propose", budgeted) == "ledger"
    assert general_writer_needed("propose", FastFacts(gated=True)) == "gated"
    assert general_writer_needed("accept", FastFacts(compensates_id="op")) == "compensation"
    assert general_writer_needed("accept", FastFacts(target=S.UNRESOLVED)) == "unresolved"
    assert general_writer_needed("accept_batch", FastFacts(ending_allowed=False)) == (
        "possible_effect"
    )
    assert general_writer_needed("accept", FastFacts(target=S.SUCCEEDED)) is None
    # The budget is read only when a row asks for it.
    asked: list[bool] = []

    def budget() -> dict[str, int]:
        asked.append(True)
        return {}

    general_writer_needed("accept", FastFacts(compensates_id="op", budget=budget))
    assert asked == []
    assert general_writer.general_writer_sql("accept") == "(o.compensates_id IS NULL) IS TRUE"
    assert "t.budget" in general_writer.general_writer_sql("claim_batch")
    with pytest.raises(ValueError):
        general_writer_needed("nope", FastFacts())
    assert tuple(sorted(S.CLAIMABLE)) == claim.CLAIM_SOURCES
