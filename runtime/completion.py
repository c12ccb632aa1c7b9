"""Completion: the agent asks for success; the runtime grants it only when nothing covered is
still running or waiting and every required check passed on the artifacts accepted *now*.

Checks run first, with no transaction open (they read storage). The decision then re-reads,
under the task's row lock, the operations and the check standings: an artifact acceptance bumps
the same row under its guarded version, so a replacement either commits before the decision
(and the decision sees the stale check) or waits for it (and is refused on the version)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.artifacts import may_write
from runtime.checks import CheckState, check_states, task_checks_run
from runtime.children import children_live_ids
from runtime.crashpoints import crash_point
from runtime.errors import CompletionRefused, InvalidInput, NotAuthorized, TaskRefused
from runtime.events import event_append_txn
from runtime.models import Operation, Task
from runtime.reactor import child_ended_txn
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition, TaskOutcome
from runtime.selectors.tasks import task_get
from runtime.transitions.status import task_transition_txn

S = OperationStatus
IF_UNRESOLVED = ("refuse", "end_unresolved")


def task_complete(actor: Actor, task_id: str, *, if_unresolved: str = "refuse") -> Task:
    """End the task ``succeeded``. Refused (``CompletionRefused``, 409, with the checks and
    operations in the way) while a required check has not passed on the current artifacts or an
    operation is still live. Unresolved operations also refuse it, unless ``if_unresolved`` is
    ``end_unresolved``: then, everything else being settled, the task ends ``unresolved`` and its
    unresolved operations stay with support staff. A task with no required checks completes on
    the agent's word. Completing a task that already succeeded returns it unchanged.

    Preconditions: the actor is the task's agent or an admin; no transaction is open."""
    if if_unresolved not in IF_UNRESOLVED:
        raise InvalidInput(f"if_unresolved must be one of {', '.join(IF_UNRESOLVED)}")
    task = task_get(actor, task_id)
    if not may_write(actor, task):
        raise NotAuthorized("only the task's agent or an admin may complete it")
    _admissible(task)
    if task.outcome == TaskOutcome.SUCCEEDED:
        return task
    ran = {s.name: s for s in task_checks_run(actor, task_id, only_missing=True)}
    now = timezone.now()
    refusal: CompletionRefused | None = None
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task_id)
        if locked.outcome == TaskOutcome.SUCCEEDED:
            return locked
        _admissible(locked)
        unresolved, blocking = _operations_in_the_way(task_id, if_unresolved)
        checks = [_merge(state, ran.get(state.name)) for state in check_states(task_id)]
        failing = [c for c in checks if not c.counts]
        # Structured concurrency: a parent's success covers its children's work.
        children = children_live_ids(task_id)
        if failing or blocking or children:
            refusal = _refusal(failing, blocking, children)
        else:
            _end_txn(locked, checks, unresolved, now=now, actor=actor)
            crash_point("complete.before_commit")
    if refusal is not None:
        _refusal_journal(task_id, task.state_version, refusal, now=now, actor=actor)
        raise refusal
    locked.refresh_from_db()
    return locked


def _operations_in_the_way(
    task_id: str, if_unresolved: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The task's unresolved operations, and those that refuse the completion (every live one,
    or every live one but the unresolved with ``end_unresolved``), as (id, status)."""
    live = list(
        Operation.objects.filter(task_id=task_id)
        .exclude(status__in=S.FINAL)
        .order_by("id")
        .values_list("id", "status")
    )
    unresolved = [op for op in live if op[1] == S.UNRESOLVED]
    blocking = [op for op in live if op[1] != S.UNRESOLVED]
    if if_unresolved == "refuse":
        blocking = live
    return unresolved, blocking


def _end_txn(
    locked: Task,
    checks: list[CheckState],
    unresolved: list[tuple[str, str]],
    *,
    now: datetime,
    actor: Actor,
) -> None:
    """The task ends ``succeeded`` (or ``unresolved``); a child's consumption lands in its
    parent's ledger now."""
    outcome = TaskOutcome.UNRESOLVED if unresolved else TaskOutcome.SUCCEEDED
    task_transition_txn(
        locked,
        now=now,
        fields={
            "outcome": outcome,
            "terminal_reason": (
                f"ended with {len(unresolved)} unresolved operation(s)" if unresolved else ""
            ),
        },
        target_condition=TaskCondition.TERMINAL,
        event_type=f"task.{outcome}",
        actor=actor.label,
        data={
            "checks": [c.name for c in checks],
            "unresolved": [op_id for op_id, _ in unresolved] or None,
        },
    )
    if locked.parent_id is not None:
        # A child's whole consumption lands in its parent's ledger as it ends, in this
        # transaction, not when the sweeper next passes.
        child_ended_txn(locked, now=now, actor=actor.label)


def _refusal_journal(
    task_id: str, state_version: int, refusal: CompletionRefused, *, now: datetime, actor: Actor
) -> None:
    """The refusal and its reasons go to the journal so people see why the task is unfinished."""
    with transaction.atomic():
        event_append_txn(
            task_id=task_id,
            type="task.completion_refused",
            state_version=state_version,
            now=now,
            actor=actor.label,
            data={"reason": refusal.message, **refusal.details},
        )


def _admissible(task: Task) -> None:
    if task.cancellation != Cancellation.NONE:
        raise TaskRefused("the task was cancelled", code="task_cancelled")
    if task.condition == TaskCondition.TERMINAL and task.outcome != TaskOutcome.SUCCEEDED:
        raise TaskRefused("the task has ended", code="task_terminal")


def _merge(state: CheckState, ran: CheckState | None) -> CheckState:
    if ran is not None and ran.pending_operation and not state.counts:
        return ran
    return state


def _refusal(
    failing: list[CheckState], blocking: list[tuple[str, str]], children: list[str]
) -> CompletionRefused:
    checks: list[dict[str, Any]] = [
        {
            "name": c.name,
            "checker": c.checker,
            "result": c.latest.result if c.latest else None,
            "reason": c.reason,
        }
        for c in failing
    ]
    operations = [{"id": op_id, "status": status} for op_id, status in blocking]
    parts = []
    if checks:
        parts.append(
            "checks not passed on the current artifacts: "
            + "; ".join(f"{c['name']} ({c['reason']})" for c in checks)
        )
    if operations:
        parts.append(
            "operations not settled: " + ", ".join(f"{o['id']} {o['status']}" for o in operations)
        )
    if children:
        parts.append("child tasks still going: " + ", ".join(children))
    details: dict[str, Any] = {"checks": checks, "operations": operations}
    if children:
        details["children"] = children
    return CompletionRefused("the task cannot succeed yet: " + " / ".join(parts), **details)
