"""Unresolved outcomes: what no machine could establish, settled by support staff. Every
resolution is a guarded transition on the operation's state version (two people resolving at
once: one wins, the other is refused) and is audited with actor, evidence and time.

Work a machine stopped for a person (``manual_intervention``: a worker lacking the tool version
it was recorded under, an approval that could not be released) is settled here too: requeued
(back to ``pending`` under the same key, once its cause is gone) or abandoned (ended with a
reason; where a call may have had an effect the status writer hands it to ``unresolved``
instead, whose resolutions then apply)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.budgets import budget_rehold_needed, budget_reserve_txn, budget_resolve_txn
from runtime.compensation import (
    compensable,
    compensation_start_txn,
    operation_and_original_lock_txn,
)
from runtime.crashpoints import crash_point
from runtime.db import outside_transaction
from runtime.errors import Conflict, InvalidInput, TransitionRejected
from runtime.models import Operation, Resolution, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn
from runtime.policy import can_resolve, task_scope
from runtime.reactor import operation_settled_txn
from runtime.resolution_records import audit_txn, lookup_invocation_txn, retry_admitted
from runtime.rules.statuses import OperationStatus
from runtime.selectors.operations import operation_get
from runtime.stoprule import unconfirmed_calls_txn
from runtime.tool_invocation import invocation_context
from runtime.tools import Contract, adapters, contract_of
from runtime.transitions.status import operation_transition_txn

S = OperationStatus

# What settles an unresolved operation, and what settles one stopped for a person.
UNRESOLVED_RESOLUTIONS = ("succeeded", "no_effect", "retry_same_key", "lookup", "compensate")
INTERVENTION_RESOLUTIONS = ("requeue", "abandon")
RESOLUTIONS = (*UNRESOLVED_RESOLUTIONS, *INTERVENTION_RESOLUTIONS)

# Which resolutions each receiver contract allows (data, like the transition tables): retrying
# under the same key is safe only where the receiver dedupes, answers lookups, or has no effect.
ALLOWED_BY_CONTRACT = {
    Contract.NONE: ("succeeded", "no_effect"),
    Contract.LOOKUP: ("succeeded", "no_effect", "retry_same_key", "lookup"),
    Contract.REPLAY: ("succeeded", "no_effect", "retry_same_key"),
    Contract.PURE: ("succeeded", "no_effect", "retry_same_key"),
}
_REFUSALS = {
    "retry_same_key": "the receiver does not dedupe or answer lookups: retrying could repeat "
    "the effect",
    "lookup": "this receiver cannot be asked what happened",
    "compensate": "there is no compensating tool, or the effect to undo is not known",
    "requeue": "a call of it may have had an effect and the receiver neither dedupes nor answers "
    "lookups: running it again could repeat the effect (abandon it to settle it as unresolved)",
}


class ResolutionNotAllowed(Conflict):
    """The receiver's contract does not allow this resolution."""

    code = "resolution_not_allowed"


def resolutions_allowed(op: Operation, *, unconfirmed: bool | None = None) -> tuple[str, ...]:
    """What a person may do with this operation: for an unresolved one, what its receiver's
    contract allows; for one stopped for a person, abandon, and requeue unless its cause is
    still there (``intervention_cause``) or a call may have had an effect that running again
    could repeat (``unconfirmed``: whether a call's outcome is unconfirmed, read when not
    given). Nothing for any other status."""
    if op.status == S.MANUAL_INTERVENTION:
        if unconfirmed is None:
            unconfirmed = op.pk in unconfirmed_calls_txn([op.pk])
        if intervention_cause(op) is not None or _requeue_repeats(op, unconfirmed=unconfirmed):
            return ("abandon",)
        return INTERVENTION_RESOLUTIONS
    if op.status != S.UNRESOLVED:
        return ()
    allowed = ALLOWED_BY_CONTRACT.get(contract_of(op.tool), ("succeeded", "no_effect"))
    return (*allowed, "compensate") if compensable(op) else allowed


def intervention_cause(op: Operation) -> str | None:
    """Why work stopped for a person would stop again if requeued now, where that can be known
    here: a worker's tool of the version it was recorded under is not in this code. (A refused
    approval release is rechecked by the claim's release gate, which stops it again, with its
    reason, if the cause is still there.)"""
    if op.executor != Operation.EXECUTOR_WORKER:
        return None
    adapter = adapters().get(op.tool)
    if adapter is None:
        return f"{op.tool} is not a tool this code has"
    if not adapter.supports(op.tool_version):
        return (
            f"{op.tool} version {op.tool_version or '?'} is still not supported "
            f"(this code runs version {adapter.version})"
        )
    return None


def _requeue_repeats(op: Operation, *, unconfirmed: bool) -> bool:
    """Running the work again could repeat an effect: a call's outcome is unconfirmed and the
    receiver offers no way to dedupe or be asked (the rule ``retry_same_key`` follows)."""
    return unconfirmed and "retry_same_key" not in ALLOWED_BY_CONTRACT.get(contract_of(op.tool), ())


def operation_resolve(
    actor: Actor,
    operation_id: str,
    *,
    resolution: str,
    evidence: str,
    state_version: int,
) -> Operation:
    """Settle an unresolved operation (``UNRESOLVED_RESOLUTIONS``) or one stopped for a person
    (``manual_intervention``: ``INTERVENTION_RESOLUTIONS``, see ``_intervention_resolve``).

    Preconditions: ``actor`` is support staff (or admin); ``state_version`` is the version the
    person looked at. Raises TransitionRejected (409 state_version_mismatch) when someone else
    changed it first, ResolutionNotAllowed where the contract forbids the resolution, and
    TaskRefused (409 task_cancelled / task_terminal) for a retry in a stopped task: that is
    decided under the task's row lock, so a stop that commits first always wins.
    """
    evidence = _resolution_checked(actor, resolution, evidence)
    op = operation_get(actor, operation_id)
    if op.state_version != state_version:
        raise TransitionRejected("someone else changed this operation first")
    if resolution in INTERVENTION_RESOLUTIONS:
        if op.status != S.MANUAL_INTERVENTION:
            raise Conflict(
                f"the operation is {op.status}, not waiting for manual intervention",
                code="not_manual_intervention",
            )
        return _intervention_resolve(actor, op, resolution, evidence, state_version)
    if op.status != S.UNRESOLVED:
        raise Conflict(f"the operation is {op.status}, not unresolved", code="not_unresolved")
    if resolution not in resolutions_allowed(op):
        raise ResolutionNotAllowed(_REFUSALS.get(resolution, "not allowed here"))
    looked_up = _looked_up(op) if resolution == "lookup" else None
    now = timezone.now()
    crash_point("resolve.before_lock")
    with transaction.atomic():
        # The global order: the operation (with the original a compensation settles), then the
        # task, read under its lock; every rule that depends on the task is applied to that row.
        operation_and_original_lock_txn(op.pk, op.compensates_id)
        op = Operation.objects.select_for_update().get(pk=operation_id)
        if op.state_version != state_version or op.status != S.UNRESOLVED:
            raise TransitionRejected("someone else changed this operation first")
        op.task = Task.objects.select_for_update().get(pk=op.task_id)
        if resolution == "retry_same_key" and op.compensates_id is None:
            retry_admitted(op.task)
        if resolution == "compensate":
            return _compensate_txn(op, actor, evidence, now)
        _unresolved_settle_txn(op, actor, resolution, evidence, looked_up, now)
    op.refresh_from_db()
    return op


def _resolution_checked(actor: Actor, resolution: str, evidence: str) -> str:
    """The evidence, stripped, once the actor may resolve and the resolution has what it needs."""
    can_resolve(actor)
    if resolution not in RESOLUTIONS:
        raise InvalidInput(f"resolution must be one of {', '.join(RESOLUTIONS)}")
    evidence = (evidence or "").strip()
    if resolution == "succeeded" and not evidence:
        raise InvalidInput("marking an operation succeeded needs evidence")
    if resolution == "abandon" and not evidence:
        raise InvalidInput("abandoning an operation needs a reason (in evidence)")
    return evidence


def _looked_up(op: Operation) -> Any:
    """What the receiver has of the call (False: no record), asked before any lock is taken: a
    receiver call must not hold the operation's row."""
    outside_transaction("asking the receiver")
    found = adapters()[op.tool].lookup(
        invocation_context(
            op, fencing_token=op.lease_generation, invocation_number=op.attempts_used
        )
    )
    crash_point("resolve.after_lookup")
    return found if found is not None else False


def _compensate_txn(op: Operation, actor: Actor, evidence: str, now: Any) -> Operation:
    """Start the compensation of an unresolved call (locked, with its task): the effect is taken
    as made, its cost posted; returns the original, now compensating."""
    from_status = op.status
    compensation = compensation_start_txn(op, actor=actor.label, now=now)
    audit_txn(op, actor, "compensate", evidence, from_status, S.COMPENSATING, now)
    budget_resolve_txn(budget=op.task.budget, op=op, effect=True, actor=actor.label, now=now)
    return Operation.objects.get(pk=compensation.compensates_id)


def _unresolved_target(
    op: Operation, resolution: str, evidence: str, looked_up: Any
) -> tuple[str, dict[str, Any]]:
    """The status a resolution of an unresolved call moves it to, and the fields it writes."""
    if resolution == "succeeded":
        return S.SUCCEEDED, {
            "result": {"resolution": "succeeded", "evidence": evidence},
            "error": None,
        }
    if resolution == "no_effect":
        return S.FAILED, {"error": {"kind": "no_effect", "message": evidence or "no effect"}}
    if resolution == "retry_same_key":
        # One more attempt, granted by a person; the key stays the same.
        return S.PENDING, {
            "max_attempts": max(op.max_attempts, op.attempts_used + 1),
            "next_attempt_at": None,
            "error": None,
        }
    if looked_up:  # lookup
        return S.SUCCEEDED, {"result": looked_up.result, "error": None}
    return S.FAILED, {"error": {"kind": "no_effect", "message": "the receiver has no record"}}


def _unresolved_settle_txn(
    op: Operation, actor: Actor, resolution: str, evidence: str, looked_up: Any, now: Any
) -> None:
    """Move an unresolved call (locked, with its task) where ``resolution`` says, with what
    follows: the lookup's invocation, the audit row, the budget, the next delivery, the
    original a compensation settles, the task's reaction."""
    from_status = op.status
    target, fields = _unresolved_target(op, resolution, evidence, looked_up)
    fields["status_reason"] = f"resolved by {actor.name}: {resolution}"
    transitioned = operation_transition_txn(
        op,
        target,
        now=now,
        fields=fields,
        actor=actor.label,
        data={"resolution": resolution, "evidence": evidence},
        event_type=f"operation.resolved_{resolution}",
    )
    if resolution == "lookup":
        # Numbered after the guarded transition: a concurrent resolution of the same
        # operation was refused above instead of colliding on the invocation number.
        lookup_invocation_txn(op, looked_up, now)
    audit_txn(op, actor, resolution, evidence, from_status, target, now)
    # Limits: a person's word (or the receiver's record) settles what the lost call may
    # have cost: posted at its hold when there was an effect, released when there was none.
    effect = {"succeeded": True, "no_effect": False, "lookup": bool(looked_up)}.get(resolution)
    budget_resolve_txn(budget=op.task.budget, op=op, effect=effect, actor=actor.label, now=now)
    if target == S.PENDING and op.executor == Operation.EXECUTOR_WORKER:
        outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)
    if op.compensates_id:
        _settle_original_txn(op, target, now, actor.label)
    operation_settled_txn(op, transitioned.task, now=now, actor=actor.label)


def _intervention_resolve(
    actor: Actor, op: Operation, resolution: str, evidence: str, state_version: int
) -> Operation:
    """Requeue or abandon work stopped for a person, in one transaction under the global lock
    order (the operation, then its task, read under its lock), guarded on the state version the
    person saw, audited with the person and the reason.

    ``requeue``: back to ``pending`` under the same key (one more attempt granted if none is
    left), announced to the workers, its estimate held again where the task has a budget and
    nothing is held (BudgetExhausted, 409, when the ledger cannot); refused
    (ResolutionNotAllowed) while its cause is still there or where running again could repeat an
    unconfirmed effect, and (TaskRefused) in a stopped task. ``abandon``: ended ``failed`` with
    the person's reason, unless a call may have had an effect: then the status writer writes
    ``unresolved`` (runtime.statemachine), and the resolutions of an unresolved operation
    apply. Returns the operation as it now is."""
    now = timezone.now()
    crash_point("resolve.before_lock")
    with transaction.atomic():
        operation_and_original_lock_txn(op.pk, op.compensates_id)
        op = Operation.objects.select_for_update().get(pk=op.pk)
        if op.state_version != state_version or op.status != S.MANUAL_INTERVENTION:
            raise TransitionRejected("someone else changed this operation first")
        op.task = Task.objects.select_for_update().get(pk=op.task_id)
        fields: dict[str, Any]
        if resolution == "requeue":
            target, fields = S.PENDING, _requeue_fields_txn(op)
        else:
            target = S.FAILED
            fields = {"error": {"kind": "abandoned", "message": evidence}}
        done = "requeued" if resolution == "requeue" else "abandoned"
        fields["status_reason"] = f"{done} by {actor.name}: {evidence}" if evidence else done
        from_status = op.status
        transitioned = operation_transition_txn(
            op,
            target,
            now=now,
            fields=fields,
            actor=actor.label,
            data={"resolution": resolution, "evidence": evidence},
        )
        if op.status == S.PENDING:
            _requeued_txn(op, now)
        audit_txn(op, actor, resolution, evidence, from_status, op.status, now)
        if op.compensates_id:
            # An abandoned compensation undid nothing: its original's effect stands, for a person.
            _settle_original_txn(op, op.status, now, actor.label)
        operation_settled_txn(op, transitioned.task, now=now, actor=actor.label)
    op.refresh_from_db()
    return op


def _requeue_fields_txn(op: Operation) -> dict[str, Any]:
    """What requeueing work stopped for a person (locked, with its task) writes, once nothing
    refuses it: its cause gone, no unconfirmed effect it could repeat, its task not stopped."""
    cause = intervention_cause(op)
    if cause is not None:
        raise ResolutionNotAllowed(f"its cause is still there: {cause}")
    if _requeue_repeats(op, unconfirmed=op.pk in unconfirmed_calls_txn([op.pk])):
        raise ResolutionNotAllowed(_REFUSALS["requeue"])
    if op.compensates_id is None:
        retry_admitted(op.task)
    return {
        "max_attempts": max(op.max_attempts, op.attempts_used + 1),
        "next_attempt_at": None,
        "error": None,
    }


def _requeued_txn(op: Operation, now: Any) -> None:
    """Requeued work's estimate held again where its task's budget needs it, and a worker's call
    announced."""
    budget = op.task.budget
    if budget_rehold_needed(budget, op):
        # The claim holds again only for a re-dispatch; the next call is numbered here.
        budget_reserve_txn(
            budget=budget,
            op=op,
            number=op.attempts_used + 1,
            now=now,
            cleanup=op.compensates_id is not None,
        )
    if op.executor == Operation.EXECUTOR_WORKER:
        outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)


def _settle_original_txn(compensation: Operation, target: str, now: Any, actor: str) -> None:
    """A person settled a compensation: its original is compensated, or stays with a person."""
    original = Operation.objects.get(pk=compensation.compensates_id)
    if original.status != S.COMPENSATING:
        return
    if target == S.FAILED:
        operation_transition_txn(
            original,
            S.UNRESOLVED,
            now=now,
            actor=actor,
            fields={"status_reason": "its compensation had no effect"},
            data={"compensation": compensation.pk},
        )


def unresolved_queue(actor: Actor, limit: int = 100) -> list[Operation]:
    """The support queue, oldest first, within what the actor may see: unresolved operations
    and work stopped for a person (manual intervention)."""
    return list(
        Operation.objects.filter(
            task_scope(actor, "task__"), status__in=(S.UNRESOLVED, S.MANUAL_INTERVENTION)
        )
        .select_related("task")
        .order_by("updated_at", "id")[:limit]
    )


def resolutions_by_operation(operation_ids: list[str]) -> dict[str, list[Resolution]]:
    """The audit history of a page of operations in one query."""
    found: dict[str, list[Resolution]] = {op_id: [] for op_id in operation_ids}
    for row in Resolution.objects.filter(operation_id__in=operation_ids).order_by("at", "id"):
        found[row.operation_id].append(row)
    return found
