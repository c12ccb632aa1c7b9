"""Task control as commands with ids and recorded dispositions: pause, resume, steer.

Pause stops admission (new work is refused with ``task_paused``) and dispatch at the next
boundary (a claim of a paused task's work takes nothing and spends its announcement; work already
running finishes and is accepted). Resume re-admits and announces again every claimable operation
that has no announcement left, so paused work is never stranded (and the claim's conditional
UPDATE keeps it to one run). Steer records a new direction in the task's versioned state; agents
read it from the task and from the ``task.steered`` event.

Locks: pause and steer take only the task row. Resume writes announcements, whose foreign key
takes a share lock on each operation at commit, so it locks the task's claimable operations
first (ascending id) and then the task row, the global order; work that became claimable between
the two steps makes it start over.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.crashpoints import crash_point
from runtime.errors import DomainError, InvalidInput, RequestInProgress, TaskRefused
from runtime.ids import new_id
from runtime.models import Operation, OutboxMessage, Task, TaskCommand
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn
from runtime.policy import can_control_task
from runtime.rules.statuses import Cancellation, OperationStatus, TaskCondition
from runtime.selectors.tasks import task_get
from runtime.transitions.status import task_transition_txn

S = OperationStatus
MAX_DIRECTION = 4000

# apply(task, command id, now, operations locked before the task) -> (disposition, detail)
Apply = Callable[[Task, str, datetime, frozenset[str]], tuple[str, str]]
# How often resume starts over when work became claimable between its two lock steps.
_RESUME_TRIES = 5


class _LockedTooFew(Exception):
    """Resume found claimable work it had not locked before the task row: start over."""


def _claimable_locked_txn(task_id: str) -> frozenset[str]:
    """The task's claimable worker-run operations, locked in ascending id: resume's announcements
    reference them (a foreign key check takes a share lock on each at commit), so they are
    locked before the task row, in the global order, and a stop holding them goes first."""
    return frozenset(
        Operation.objects.select_for_update()
        .filter(task_id=task_id, status__in=S.CLAIMABLE, executor=Operation.EXECUTOR_WORKER)
        .order_by("id")
        .values_list("pk", flat=True)
    )


def _run(
    actor: Actor,
    task_id: str,
    kind: str,
    payload: dict[str, Any],
    apply: Apply,
    *,
    lock_claimable: bool = False,
) -> tuple[Task, TaskCommand]:
    """Record the command with its disposition; apply it under the task's row lock. A refusal
    is recorded too (its own savepoint commits) and then raised. With ``lock_claimable`` (resume)
    the task's claimable operations are locked first, then the task (the global lock order)."""
    task = task_get(actor, task_id)
    can_control_task(actor, task)
    for _ in range(_RESUME_TRIES):
        try:
            return _run_txn(actor, task_id, kind, payload, apply, lock_claimable=lock_claimable)
        except _LockedTooFew:
            continue
    raise RequestInProgress("the task's work keeps changing; retry the command")


def _run_txn(
    actor: Actor,
    task_id: str,
    kind: str,
    payload: dict[str, Any],
    apply: Apply,
    *,
    lock_claimable: bool,
) -> tuple[Task, TaskCommand]:
    command_id = new_id("cmd")
    refusal: DomainError | None = None
    with transaction.atomic():
        locked = _claimable_locked_txn(task_id) if lock_claimable else frozenset()
        task = Task.objects.select_for_update().get(pk=task_id)
        now = timezone.now()
        if task.condition == TaskCondition.TERMINAL:
            refusal = TaskRefused("the task has ended", code="task_terminal")
        elif task.cancellation != Cancellation.NONE:
            refusal = TaskRefused("the task was cancelled", code="task_cancelled")
        if refusal is not None:
            disposition, detail = TaskCommand.REFUSED, refusal.message
        else:
            disposition, detail = apply(task, command_id, now, locked)
        command = TaskCommand.objects.create(
            id=command_id,
            task=task,
            kind=kind,
            payload=payload,
            disposition=disposition,
            detail=detail,
            actor=actor.label,
            task_state_version=task.state_version,
            at=now,
        )
        crash_point("control.applied")
    if refusal is not None:
        raise refusal
    task.refresh_from_db()
    return task, command


def task_pause(actor: Actor, task_id: str, *, reason: str = "") -> tuple[Task, TaskCommand]:
    """Pause a task. Preconditions: the actor may control it (agent, operator, admin)."""

    def apply(
        task: Task, command_id: str, now: datetime, locked: frozenset[str]
    ) -> tuple[str, str]:
        if task.paused:
            return TaskCommand.NO_CHANGE, "already paused"
        task_transition_txn(
            task,
            now=now,
            fields={"paused": True},
            event_type="task.paused",
            actor=actor.label,
            data={"command": command_id, "reason": reason},
        )
        return TaskCommand.APPLIED, "paused: no new work is admitted or dispatched"

    return _run(actor, task_id, "pause", {"reason": reason}, apply)


def task_resume(actor: Actor, task_id: str, *, reason: str = "") -> tuple[Task, TaskCommand]:
    """Resume a paused task and announce its claimable work again."""

    def apply(
        task: Task, command_id: str, now: datetime, locked: frozenset[str]
    ) -> tuple[str, str]:
        if not task.paused:
            return TaskCommand.NO_CHANGE, "not paused"
        announced = set(
            OutboxMessage.objects.filter(operation__task_id=task.pk).values_list(
                "operation_id", flat=True
            )
        )
        stranded = [
            op
            for op in Operation.objects.filter(
                task_id=task.pk, status__in=S.CLAIMABLE, executor=Operation.EXECUTOR_WORKER
            ).order_by("id")
            if op.pk not in announced
        ]
        if any(op.pk not in locked for op in stranded):
            raise _LockedTooFew  # rolls back; the next try locks it before the task
        for op in stranded:
            outbox_enqueue_txn(
                topic=TOPIC_EXECUTE,
                operation_id=op.pk,
                now=now,
                available_at=max(op.next_attempt_at or now, now),
            )
        task_transition_txn(
            task,
            now=now,
            fields={"paused": False},
            event_type="task.resumed",
            actor=actor.label,
            data={"command": command_id, "reason": reason, "reannounced": len(stranded)},
        )
        return TaskCommand.APPLIED, f"resumed; {len(stranded)} operation(s) announced again"

    return _run(actor, task_id, "resume", {"reason": reason}, apply, lock_claimable=True)


def task_steer(actor: Actor, task_id: str, *, direction: str) -> tuple[Task, TaskCommand]:
    """Record a new direction in the task's versioned state."""
    direction = (direction or "").strip()
    if not direction or len(direction) > MAX_DIRECTION:
        raise InvalidInput(f"direction must have 1 to {MAX_DIRECTION} characters")

    def apply(
        task: Task, command_id: str, now: datetime, locked: frozenset[str]
    ) -> tuple[str, str]:
        version = task.direction_version + 1
        task_transition_txn(
            task,
            now=now,
            fields={"direction": direction, "direction_version": version},
            event_type="task.steered",
            actor=actor.label,
            data={"command": command_id, "direction": direction, "direction_version": version},
        )
        return TaskCommand.APPLIED, f"direction version {version}"

    return _run(actor, task_id, "steer", {"direction": direction}, apply)


def paused_claim_refused_txn(operation_id: str, task_id: str) -> str:
    """The claim's pause hook: under the task's row lock (taken before any operation row, so the
    lock order holds), a delivery for a paused task spends its announcement; resume, which
    takes the same lock, announces the work again. If the task was resumed meanwhile, the
    announcement stays for the sweeper to publish again. Returns the refusal's reason."""
    paused = list(
        Task.objects.select_for_update().filter(pk=task_id).values_list("paused", flat=True)
    )
    if paused and paused[0]:
        OutboxMessage.objects.filter(operation_id=operation_id).delete()
        return "the task is paused"
    return "the task was resumed meanwhile; the announcement is kept"


def commands_of_task(task_id: str, limit: int = 100) -> list[TaskCommand]:
    return list(TaskCommand.objects.filter(task_id=task_id).order_by("at", "id")[:limit])
