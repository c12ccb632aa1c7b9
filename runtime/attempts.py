"""Attempts: a new pursuit of a task, distinguishable from recovery. It gets its own allocation
from the task's allowance, its own operations and keys (derived keys include the attempt
number); the earlier attempt's operations and unresolved effects stay where they are, visible,
holding what they hold in the earlier attempt's ledger."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from runtime.actors import Actor
from runtime.budget_allocations import attempt_allocate_txn
from runtime.crashpoints import crash_point
from runtime.errors import InvalidInput, RequestInProgress
from runtime.events import event_append_txn
from runtime.models import Attempt, Operation, Task
from runtime.policy import can_start_attempt
from runtime.rules.admission import task_admission_check
from runtime.rules.statuses import OperationStatus, TaskOutcome
from runtime.selectors.tasks import task_get
from runtime.transitions.status import attempt_end_txn

T = TypeVar("T")


def attempt_create(actor: Actor, task_id: str, *, reason: str = "") -> Attempt:
    """Start attempt N+1 of a task that still admits work.

    Preconditions: none; NotFound when the actor may not see the task, NotAuthorized unless
    policy.can_start_attempt. Refused like a proposal when the task is cancelled, ended, paused
    or past its deadline."""
    task = task_get(actor, task_id)
    can_start_attempt(actor, task)
    if len(reason) > 2000:
        raise InvalidInput("reason is longer than 2000 characters")
    now = timezone.now()
    with transaction.atomic():
        # The task row is the only row this takes before the ledger rows (lock order).
        task = (
            Task.objects.select_for_update(of=("self",))
            .select_related("current_attempt")
            .get(pk=task_id)
        )
        task_admission_check(
            condition=task.condition,
            cancellation=task.cancellation,
            paused=task.paused,
            deadline=task.deadline,
            now=now,
        )
        previous = task.current_attempt
        number = (Attempt.objects.filter(task=task).aggregate(n=Max("number"))["n"] or 0) + 1
        if previous is not None:
            # The replaced pursuit ends: failed, or unresolved while it keeps an effect nobody
            # could establish (the seeds: a terminal attempt may retain an unresolved operation).
            keeps_unresolved = Operation.objects.filter(
                attempt=previous, status=OperationStatus.UNRESOLVED
            ).exists()
            attempt_end_txn(
                previous.pk,
                task_id=task.pk,
                outcome=TaskOutcome.UNRESOLVED if keeps_unresolved else TaskOutcome.FAILED,
                reason=f"replaced by attempt {number}" + (f": {reason}" if reason else ""),
                now=now,
                actor=actor.label,
            )
        attempt = Attempt.objects.create(
            task=task, number=number, reason=reason, created_by=actor.label
        )
        Task.objects.filter(pk=task.pk).update(current_attempt=attempt)
        attempt_allocate_txn(task=task, previous=previous, attempt=attempt)
        event_append_txn(
            task_id=task.pk,
            type="attempt.started",
            state_version=task.state_version,
            now=now,
            actor=actor.label,
            data={
                "attempt": number,
                "previous": previous.number if previous else None,
                "reason": reason,
            },
        )
        crash_point("attempt.before_commit")
    return attempt


def attempts_of(task: Task) -> list[Attempt]:
    return list(Attempt.objects.filter(task=task).order_by("number"))


# --- binding a proposal to the task's current attempt -------------------------------------
# A new attempt is a new pursuit: what is proposed into it (a tool call, a wait) carries its
# number in its derived key and books in its ledger. The attempt is read before the task's row
# lock is held, so every proposal checks it again under that lock and starts over when a new
# attempt committed in between: one rule for every kind of proposal
# (runtime.transitions.propose, runtime.transitions.propose_wait; the one-statement form,
# propose_txn, checks it inside its statement).


class AttemptMoved(Exception):
    """A new attempt of the task committed between a proposal's read of the task and its lock of
    the task row: nothing was written; the caller proposes again under the new attempt."""


# How often a proposal starts over because a new attempt committed under it (each time one did).
ATTEMPT_MOVES = 3


def attempt_bound(propose: Callable[[], T]) -> T:
    """Run ``propose`` (one try of a proposal) again while it raises AttemptMoved, which a try
    raises, having written nothing, when the attempt it read is no longer the task's current one
    under the task's lock (``attempt_unmoved_txn``). RequestInProgress (409, the client retries)
    when new attempts kept committing under it."""
    for _ in range(ATTEMPT_MOVES):
        try:
            return propose()
        except AttemptMoved:
            continue
    raise RequestInProgress("the task's attempt kept changing while proposing; retry")


def attempt_unmoved_txn(task_id: str, attempt_id: str) -> None:
    """Lock the task's row and check that its current attempt is still ``attempt_id`` (the one
    the proposal read without the lock, and derived its key from); AttemptMoved when it is not.

    Preconditions: inside the proposal's transaction, before it touches any row but its own new
    operation (nobody else's yet), so the global lock order (operations, then the task) holds."""
    current = (
        Task.objects.select_for_update(no_key=True)
        .filter(pk=task_id)
        .values_list("current_attempt_id", flat=True)
        .get()
    )
    if (current or "") != attempt_id:
        raise AttemptMoved
