"""The one writer of status: a guarded UPDATE that must touch exactly one row, plus the journal
event, in the caller's transaction.

    UPDATE ... SET status=new, state_version=state_version+1, ...
    WHERE id=? AND status=expected AND state_version=? [AND lease_generation=?]

Zero rows is a rejection (``TransitionRejected``): the caller records the rejected observation;
nothing is ever overwritten.

It also owns one rule every ending obeys, whoever asks for it: a possible effect is never ended
as anything but ``unresolved`` except by a person resolving it (``operation_transition_txn``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F

from runtime.crashpoints import crash_point
from runtime.errors import Conflict, StaleLease, TransitionRejected
from runtime.events import TaskRow, event_append_txn
from runtime.models import Approval, Attempt, Operation, Task
from runtime.notify_events import task_failed_noticed_txn, unresolved_noticed_txn
from runtime.rules.statuses import (
    APPROVAL,
    CANCELLATION,
    OPERATION,
    TASK,
    OperationStatus,
    TaskOutcome,
)
from runtime.stoprule import CONFIRMED_OUTCOMES, unconfirmed_calls_txn
from runtime.tools import Contract, contract_of

S = OperationStatus

# The endings that assert what became of the work (it failed, ran out of time, was called off)
# and so may not be written over a call whose effect nobody confirmed. ``succeeded`` asserts the
# effect, ``unresolved`` hands it to a person, ``compensated`` says it was undone; the other
# statuses are not endings (``manual_intervention`` is already with a person).
ENDINGS_NEEDING_CONFIRMATION = (S.FAILED, S.EXPIRED, S.CANCELLED)
# The journal event of an ending held back for a person (the ending asked for is in its data).
ENDED_UNCONFIRMED_EVENT = "operation.ended_unconfirmed"
UNCONFIRMED_NOTE = "a call's outcome is unconfirmed: a person decides"


class PossibleEffect(Conflict):
    """A call of this operation may have had an effect nobody confirmed, and the operation's
    status has no way to a person's hands (``unresolved``): it cannot be ended this way."""

    code = "possible_effect"


def status_deltas(source: str | None, target: str | None) -> tuple[int, int, int]:
    """How a move from ``source`` to ``target`` changes a task's (active, claimable, blocked)
    counts. ``None`` stands for "no operation" (creation)."""

    def weight(status: str | None) -> tuple[int, int, int]:
        if status is None:
            return (0, 0, 0)
        return (
            1 if status in S.ACTIVE else 0,
            1 if status in S.CLAIMABLE else 0,
            1 if status in S.BLOCKED else 0,
        )

    before, after = weight(source), weight(target)
    return (after[0] - before[0], after[1] - before[1], after[2] - before[2])


@dataclass(frozen=True)
class Transitioned:
    name: str
    state_version: int
    task: TaskRow
    event_seq: int


def ending_needs_calls_read(op: Operation, target: str) -> bool:
    """Whether moving ``op`` to ``target`` must first read its calls (the rule of
    ``operation_transition_txn``): an ending that asserts what became of the work, of a tool
    that is not pure, that has made a call, and not a person's resolution (only people move an
    ``unresolved`` operation). Pure, on the operation as read; no statement."""
    return (
        target in ENDINGS_NEEDING_CONFIRMATION
        and op.status != S.UNRESOLVED
        and op.attempts_used > 0
        and contract_of(op.tool) != Contract.PURE
    )


def fast_ending_allowed(op: Operation, target: str, call_outcome: str) -> bool:
    """Whether a one-statement form (runtime.transitions.fast), which writes ``target`` with the
    outcome ``call_outcome`` of the call it reports and reads no other call, writes what the rule
    would: yes unless the rule applies and either that outcome is unconfirmed or an earlier call
    exists (``op`` is the claim's snapshot: its ``attempts_used`` numbers the reported call). When
    not, the caller declines to the general path, whose writer applies the rule."""
    if not ending_needs_calls_read(op, target):
        return True
    return op.attempts_used <= 1 and call_outcome in CONFIRMED_OUTCOMES


def _held_for_a_person(
    operation: Operation,
    target: str,
    fields: dict[str, Any],
    data: dict[str, Any],
    event_type: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields and event data of ``target`` asked for and ``unresolved`` written instead: the
    caller's reason kept, the unconfirmed call noted, nothing left to retry."""
    if not OPERATION.allows(operation.status, S.UNRESOLVED):
        raise PossibleEffect(
            f"operation {operation.pk} may have had an effect nobody confirmed; it cannot go "
            f"from {operation.status} to {target}",
            operation=operation.pk,
        )
    reason = str(fields.get("status_reason") or data.get("reason") or f"ended {target}")
    reason = f"{reason}; {UNCONFIRMED_NOTE}"
    held = {
        **fields,
        "status_reason": reason,
        "error": {"kind": "unknown", "message": reason, "ending": target},
        "next_attempt_at": None,
    }
    noted = {**data, "reason": reason, "ending": target}
    if event_type:
        noted["ending_event"] = event_type
    return held, noted


def operation_transition_txn(
    operation: Operation,
    target: str,
    *,
    now: datetime,
    fields: dict[str, Any] | None = None,
    lease_generation: int | None = None,
    where: dict[str, Any] | None = None,
    actor: str,
    data: dict[str, Any] | None = None,
    event_type: str | None = None,
) -> Transitioned:
    """Move ``operation`` from the status and state version it was read with to ``target``.

    Preconditions: inside a transaction; ``operation`` carries the status/state_version the
    caller observed. With ``lease_generation`` the move is also fenced on the lease; ``where``
    adds predicates of the caller's own (a lease token digest, ``lease_expires_at__lt``), checked
    in the same statement so nothing can change between the check and the write. Raises
    ``InvalidTransition`` for an edge the table lacks and ``TransitionRejected`` (or
    ``StaleLease`` when fenced) when the row has moved on; on success updates ``operation`` in
    place (read ``operation.status`` for what was written). Locks: the operation row, then
    (through the journal) the task row: the global order.

    The possible-effect rule, applied here so no caller can forget it: an ending that asserts
    what became of the work (``failed``, ``expired``, ``cancelled``) of a tool that is not pure,
    while a call of it has an outcome nobody confirmed (``runtime.stoprule.unconfirmed_calls_txn``:
    lost with its lease, unknown, terminated, never reported), is written as ``unresolved``
    instead, whoever asks (a worker, the sweeper, a claim, a cancel, a person abandoning work):
    the caller's reason is kept with the note, the journal event is ``operation.ended_unconfirmed``
    (the ending asked for in its data), support staff are told, and nothing touches the budget
    here, so what the lost call held stays ``unknown`` until a person resolves it. Only a
    person's resolution (a move out of ``unresolved``) may end it otherwise. Where the status has
    no edge to ``unresolved`` the ending is refused (``PossibleEffect``, 409). It redirects
    rather than refuses so that a machine's caller (a claim finding no attempt left, a sweep)
    cannot leave the work stranded by failing; it says so by the status it writes.
    A reporter must record its own call's outcome before this call (in the same transaction),
    or its call counts as unconfirmed. The calls are read before the guarded UPDATE: a report or
    takeover that changes them meanwhile also moves the state version, so the UPDATE refuses.
    """
    fields = dict(fields or {})
    data = dict(data or {})
    if ending_needs_calls_read(operation, target) and unconfirmed_calls_txn([operation.pk]):
        fields, data = _held_for_a_person(operation, target, fields, data, event_type)
        target, event_type = S.UNRESOLVED, ENDED_UNCONFIRMED_EVENT
    name = OPERATION.check(operation.status, target)
    source = operation.status
    _guarded_update(
        operation, target, now=now, fields=fields, lease_generation=lease_generation, where=where
    )
    return _journal_txn(
        operation, source, target, name, now=now, actor=actor, data=data, event_type=event_type
    )


def _journal_txn(
    operation: Operation,
    source: str,
    target: str,
    name: str,
    *,
    now: datetime,
    actor: str,
    data: dict[str, Any],
    event_type: str | None,
) -> Transitioned:
    """The journal event of a move ``operation_transition_txn`` wrote (the task's counters
    with it), and support staff's notice of an ``unresolved`` operation."""
    payload = {"from": source, "to": target, "status": target}
    payload.update(data)
    event, task = event_append_txn(
        task_id=operation.task_id,
        type=event_type or f"operation.{name}",
        state_version=operation.state_version,
        now=now,
        deltas=status_deltas(source, target),
        op=operation,
        actor=actor,
        data=payload,
    )
    if target == S.UNRESOLVED:
        # Support staff hear of it (runtime.notify_events: a row here, sent after the commit).
        unresolved_noticed_txn(
            operation_id=operation.pk,
            task_id=operation.task_id,
            tool=operation.tool,
            state_version=operation.state_version,
            actor=actor,
            now=now,
        )
    return Transitioned(name, operation.state_version, task, event.seq)


def _guarded_update(
    operation: Operation,
    target: str,
    *,
    now: datetime,
    fields: dict[str, Any],
    lease_generation: int | None,
    where: dict[str, Any] | None,
) -> None:
    """The conditional UPDATE of ``operation_transition_txn`` (one row, or a rejection), then
    ``operation`` updated in place to what was written."""
    guard: dict[str, Any] = {
        "pk": operation.pk,
        "status": operation.status,
        "state_version": operation.state_version,
        **(where or {}),
    }
    if lease_generation is not None:
        guard["lease_generation"] = lease_generation
    touched = Operation.objects.filter(**guard).update(
        status=target, state_version=F("state_version") + 1, updated_at=now, **fields
    )
    crash_point("operation.updated")
    if touched != 1:
        err = StaleLease if lease_generation is not None else TransitionRejected
        raise err(
            f"operation {operation.pk} is no longer {operation.status} at version "
            f"{operation.state_version}",
            operation=operation.pk,
        )
    operation.status = target
    operation.state_version += 1
    for key, value in fields.items():
        if not hasattr(value, "resolve_expression"):
            setattr(operation, key, value)


def task_transition_txn(
    task: Task,
    *,
    now: datetime,
    fields: dict[str, Any],
    event_type: str,
    target_condition: str | None = None,
    actor: str,
    data: dict[str, Any] | None = None,
) -> Transitioned:
    """Change a task's own fields (condition, outcome, cancellation, pause) under its state
    version. Preconditions as for operations; ``task`` carries what the caller observed. A new
    condition must be an edge of the TASK table and a new cancellation one of the CANCELLATION
    table (InvalidTransition otherwise)."""
    values = dict(fields)
    if target_condition is not None and target_condition != task.condition:
        TASK.check(task.condition, target_condition)
        values["condition"] = target_condition
    cancellation = values.get("cancellation", task.cancellation)
    if cancellation != task.cancellation:
        CANCELLATION.check(task.cancellation, cancellation)
    touched = Task.objects.filter(
        pk=task.pk, state_version=task.state_version, condition=task.condition
    ).update(state_version=F("state_version") + 1, updated_at=now, **values)
    if touched != 1:
        raise TransitionRejected(f"task {task.pk} changed since version {task.state_version}")
    task.state_version += 1
    for key, value in values.items():
        setattr(task, key, value)
    event, row = event_append_txn(
        task_id=task.pk,
        type=event_type,
        state_version=task.state_version,
        now=now,
        actor=actor,
        data=data,
    )
    if values.get("outcome") == TaskOutcome.FAILED:
        task_failed_noticed_txn(
            task_id=task.pk, reason=str(values.get("terminal_reason") or ""), actor=actor, now=now
        )
    if values.get("outcome") and task.current_attempt_id:
        # A task's end is its current attempt's end, in the same transaction.
        attempt_end_txn(
            task.current_attempt_id,
            task_id=task.pk,
            outcome=str(values["outcome"]),
            reason=event_type,
            now=now,
            actor=actor,
        )
    return Transitioned(event_type, task.state_version, row, event.seq)


def attempt_end_txn(
    attempt_id: str, *, task_id: str, outcome: str, reason: str, now: datetime, actor: str
) -> bool:
    """End an attempt inside the caller's transaction: one guarded UPDATE (an attempt ends once)
    and its ``attempt.ended`` event. False when it had already ended."""
    touched = Attempt.objects.filter(pk=attempt_id, ended_at__isnull=True).update(
        ended_at=now, outcome=outcome, end_reason=reason[:2000]
    )
    if touched != 1:
        return False
    number = Attempt.objects.filter(pk=attempt_id).values_list("number", flat=True).get()
    event_append_txn(
        task_id=task_id,
        type="attempt.ended",
        state_version=None,
        now=now,
        actor=actor,
        data={"attempt": number, "outcome": outcome, "reason": reason[:2000]},
    )
    return True


def approval_transition_txn(
    approval: Approval,
    target: str,
    *,
    now: datetime,
    fields: dict[str, Any] | None = None,
    extra_guard: dict[str, Any] | None = None,
) -> str:
    """Move ``approval`` from the status and version it was read with to ``target`` (the APPROVAL
    table), guarded like operations; ``extra_guard`` adds predicates to the same UPDATE (the
    release gate's validity and parameter hash). Raises TransitionRejected on zero rows. The
    journal event is written by the caller, which knows the operation's side of the change.
    Preconditions: inside a transaction."""
    name = APPROVAL.check(approval.status, target)
    values = dict(fields or {})
    touched = Approval.objects.filter(
        pk=approval.pk,
        status=approval.status,
        state_version=approval.state_version,
        **(extra_guard or {}),
    ).update(status=target, state_version=F("state_version") + 1, **values)
    if touched != 1:
        raise TransitionRejected(
            f"approval {approval.pk} is no longer {approval.status} at version "
            f"{approval.state_version}"
        )
    approval.status = target
    approval.state_version += 1
    for key, value in values.items():
        setattr(approval, key, value)
    return name
