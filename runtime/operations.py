"""Operations: one logical action each. Proposal, reads, and acceptance of an invocation's result.

Acceptance is one transaction: result + status + invocation receipt + journal event (+ next
outbox rows) commit together, fenced on lease generation and state version, or not at all.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import random
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from runtime import dialect, hotpath
from runtime.actors import Actor, execution_actor
from runtime.admission import queue_admit_txn, queue_limited, tool_class_of
from runtime.approval_gate import (
    MAX_APPROVAL_TIMEOUT_SECONDS,
    approval_request_txn,
    first_proposal_hash,
)
from runtime.attempts import AttemptMoved, attempt_bound, attempt_unmoved_txn
from runtime.budgets import (
    budget_remember,
    budget_reserve_txn,
    budget_settle_txn,
    task_budget,
)
from runtime.compensation import operation_and_original_lock_txn
from runtime.crashpoints import crash_point
from runtime.db import contention_retry, durable_statement
from runtime.errors import (
    IdempotencyKeyReused,
    InvalidInput,
    NotFound,
    RequestInProgress,
    StaleLease,
    UnknownTool,
)
from runtime.events import TaskRow, event_append_txn
from runtime.hashing import params_hash
from runtime.leases import (
    Lease,
    Refusal,
    claim_fast_txn,
    lease_token_digest,
    lease_token_matches,
    operation_claim,
)
from runtime.models import Invocation, Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn
from runtime.policy import can_claim, can_propose, task_scope
from runtime.reactor import operation_settled_txn
from runtime.rules.admission import task_admission_check
from runtime.rules.general_writer import (
    ACCEPT,
    ACCEPT_BATCH,
    PROPOSE,
    FastFacts,
    general_writer_needed,
)
from runtime.rules.statuses import OPERATION, OperationStatus
from runtime.specs import OperationSpec
from runtime.statemachine import (
    fast_ending_allowed,
    operation_transition_txn,
    rejection_record,
    status_deltas,
)
from runtime.stoprule import stop_target, task_stopping, unconfirmed_calls_txn
from runtime.tasks import (
    given_key_validate,
    operation_by_legacy_key,
    operation_key,
    task_for_proposal,
)
from runtime.text import name_check
from runtime.tools import (
    Contract,
    ToolAdapter,
    ToolFailure,
    adapter_for,
    adapters,
    contract_of,
)
from runtime.waits import wait_propose

S = OperationStatus
log = logging.getLogger(__name__)

MAX_ATTEMPTS_CEILING = 100


def _validate(spec: OperationSpec) -> None:
    if spec.kind not in Operation.KINDS:
        raise InvalidInput(f"kind must be one of {', '.join(Operation.KINDS)}")
    if spec.executor not in Operation.EXECUTORS:
        raise InvalidInput(f"executor must be one of {', '.join(Operation.EXECUTORS)}")
    if not spec.step or len(spec.step) > 200:
        raise InvalidInput("step is required (at most 200 characters)")
    name_check(spec.step, "step")
    if spec.intent_version < 1:
        raise InvalidInput("intent_version must be at least 1")
    if spec.max_attempts is not None and not (1 <= spec.max_attempts <= MAX_ATTEMPTS_CEILING):
        raise InvalidInput(f"max_attempts must be between 1 and {MAX_ATTEMPTS_CEILING}")
    if spec.idempotency_key is not None and not (0 < len(spec.idempotency_key) <= 300):
        raise InvalidInput("idempotency_key must have 1 to 300 characters")
    if not spec.tool:
        raise InvalidInput("tool is required for tool operations")


def operation_propose(actor: Actor, task_id: str, spec: OperationSpec) -> tuple[Operation, bool]:
    """Record an intended action and announce it to the workers, in a transaction of its own
    (the entry for a caller that holds none); returns (operation, created).

    The same idempotency key (given, or derived from task, step, tool and intent version) with the
    same parameter hash returns the existing operation; with another hash it is a conflict.
    Preconditions: no transaction is open (RuntimeError, as ``atomic(durable=True)`` raises it:
    a caller inside one calls ``operation_propose_txn``). NotFound when the actor may not see
    the task, NotAuthorized when it may see but not propose into it (policy.can_propose). The
    key is namespaced by the task's owner (runtime/keys.py); a given key inside another owner's
    namespace is refused. Admission (cancelled, paused, terminal, deadline) is checked under the
    task's row lock, so it cannot race a cancellation; so is the attempt the operation binds to
    (its key, its ledger): a new attempt committed meanwhile makes the proposal start over
    under it.
    """
    return _proposal(actor, task_id, spec, in_caller=False)


def operation_propose_txn(
    actor: Actor, task_id: str, spec: OperationSpec
) -> tuple[Operation, bool]:
    """``operation_propose`` inside the caller's transaction (a request's, a dispatcher's): the
    operation commits with the caller's writes, or not at all.

    Preconditions: a transaction is open, and the caller takes a refusal (a DomainError) as the
    end of it: the one statement that may refuse runs without a savepoint of its own (two round
    trips fewer on every proposal that is not refused), so a refusal leaves the caller's
    transaction marked for rollback. An entry point has nothing else to keep; a caller that
    must go on after a refusal wraps the call in a savepoint of its own
    (``transaction.atomic()``)."""
    return _proposal(actor, task_id, spec, in_caller=True)


def _proposal(
    actor: Actor, task_id: str, spec: OperationSpec, *, in_caller: bool
) -> tuple[Operation, bool]:
    if spec.kind in (Operation.KIND_WAIT_SIGNAL, Operation.KIND_TIMER):
        return wait_propose(actor, task_id, spec)
    _validate(spec)
    return attempt_bound(lambda: _propose(actor, task_id, spec, in_caller=in_caller))


def _statement_block(tool: str, *, in_caller: bool) -> AbstractContextManager[Any]:
    """Where the proposal statement runs. Inside the caller's transaction: without a savepoint
    (a refusal fails the statement, which wrote nothing, and ends the caller's transaction, as
    ``operation_propose_txn`` says). As a transaction of its own: the statement alone
    (autocommit: no BEGIN and COMMIT round trips, and the task row is locked only while the
    server runs it), or a durable transaction when a queue's capacity is counted first (the
    count and the insert commit together)."""
    if in_caller:
        return transaction.atomic(savepoint=False)
    if queue_limited(tool):
        return transaction.atomic(durable=True)
    return durable_statement()


def _propose(
    actor: Actor, task_id: str, spec: OperationSpec, *, in_caller: bool
) -> tuple[Operation, bool]:
    """One try of ``operation_propose``; raises AttemptMoved when the task's current
    attempt, read under its lock, is not the one read before it (nothing is written)."""
    task = task_for_proposal(actor, task_id)
    if task is None:
        raise NotFound("no such task")
    can_propose(actor, task)
    adapter = adapter_for(spec.tool)
    if (adapter.system_only and actor.kind != "system") or not adapter.offered:
        raise UnknownTool(f"no tool named {spec.tool!r}", tool=spec.tool)
    if adapter.agent_run and spec.executor != Operation.EXECUTOR_AGENT:
        raise InvalidInput(
            f"{spec.tool} is run by the agent that proposes it: propose it with executor agent",
            field="executor",
        )
    adapter.validate(spec.params)
    budget_remember(task.pk, task.budget)  # read anyway: settling later needs no statement
    # A new attempt is a new pursuit: its derived keys carry the attempt number.
    attempt_number = getattr(task, "attempt_number", None) or 1
    derived = spec.idempotency_key or adapter.key_for(
        task.pk, spec.step, spec.params, spec.intent_version, attempt=attempt_number
    )
    key = operation_key(task, derived)  # another owner's namespace first: 403
    if spec.idempotency_key and not spec.key_derived:
        given_key_validate(spec.idempotency_key)
    derived = "" if spec.idempotency_key else derived
    digest = params_hash(spec.params)
    if derived:
        # Stored before parts were escaped (runtime.keys): found under its legacy key.
        legacy = operation_by_legacy_key(
            task,
            derived,
            kind=spec.kind,
            tool=spec.tool,
            step=spec.step,
            intent_version=spec.intent_version,
        )
        if legacy is not None:
            return _same_intent_or_conflict(legacy, digest), False
    gated = adapter.requires_approval(spec.params)
    if spec.approval_timeout_seconds is not None and not (
        1 <= spec.approval_timeout_seconds <= MAX_APPROVAL_TIMEOUT_SECONDS
    ):
        raise InvalidInput(
            f"approval_timeout_seconds must be between 1 and {MAX_APPROVAL_TIMEOUT_SECONDS}"
        )
    initial = S.WAITING_APPROVAL if gated else S.PENDING

    now = timezone.now()
    op = Operation(
        task_id=task.pk,
        attempt_id=task.current_attempt_id or "",
        kind=spec.kind,
        tool=spec.tool,
        tool_version=adapter.version,
        step=spec.step,
        intent_version=spec.intent_version,
        params=spec.params,
        params_hash=digest,
        idempotency_key=key,
        executor=spec.executor,
        status=initial,
        approval_required=gated,
        max_attempts=spec.max_attempts or adapter.max_attempts,
        estimate=spec.estimate,
        signal=spec.signal,
        timeout_seconds=spec.timeout_seconds,
        deadline=task.deadline,
    )
    fast = FastFacts(gated=gated, budget=lambda: task.budget)
    if dialect.one_statement_forms() and general_writer_needed(PROPOSE, fast) is None:
        # One statement: INSERT ... ON CONFLICT DO NOTHING with the event and the outbox row,
        # admission checked inside it under the task's row lock (a refusal fails the statement,
        # which then wrote nothing); _statement_block says in which transaction. (A task with a
        # budget declines to the general path, whose guarded meter UPDATEs hold the estimate in
        # the same transaction.)
        moved = False
        with _statement_block(spec.tool, in_caller=in_caller):
            # Limits: a tool class at its queue capacity refuses before anything is written.
            queue_admit_txn(spec.tool)
            try:
                row = hotpath.propose_txn(op, actor=actor.label, now=now)
            except AttemptMoved:
                # Raised once the block is left: it wrote nothing and failed no statement, and
                # raised through a block without a savepoint it would doom the transaction.
                moved = True
        if moved:
            raise AttemptMoved
        if row is not None:
            return op, True
    else:
        existing = Operation.objects.filter(task=task, idempotency_key=key).first()
        if existing is not None:
            return _same_intent_or_conflict(existing, digest), False
        try:
            # A savepoint inside the caller's transaction: a concurrent proposal's win (the
            # unique key) is read below, in the same transaction.
            with transaction.atomic(durable=not in_caller):
                # Limits: a tool class at its queue capacity refuses before anything is written.
                queue_admit_txn(spec.tool)
                # The attempt is read under the task's lock (taken before the insert: the new
                # operation row is nobody else's yet, so the lock order is kept).
                attempt_unmoved_txn(task.pk, op.attempt_id)
                op.save(force_insert=True)
                _, row = event_append_txn(
                    task_id=task.pk,
                    type="operation.proposed",
                    state_version=op.state_version,
                    now=now,
                    deltas=status_deltas(None, initial),
                    operation_id=op.pk,
                    actor=actor.label,
                    data={
                        "tool": spec.tool,
                        "step": spec.step,
                        "status": initial,
                        "kind": spec.kind,
                    },
                )
                _admit(row, now)
                # Limits: hold the estimate in the attempt's ledger (no statement unbudgeted).
                budget_reserve_txn(budget=task.budget, op=op, number=0, now=now)
                if gated:
                    # Nothing reaches the outbox until a person releases it.
                    approval_request_txn(
                        op,
                        task=task,
                        actor=actor,
                        adapter=adapter,
                        timeout_seconds=spec.approval_timeout_seconds,
                        now=now,
                    )
                elif spec.executor == Operation.EXECUTOR_WORKER:
                    outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)
            return op, True
        except IntegrityError:
            pass  # a concurrent proposal with the same key won the unique constraint
    existing = Operation.objects.filter(task=task, idempotency_key=key).first()
    if existing is None:
        raise RequestInProgress("a proposal under this key is in progress; retry")
    return _same_intent_or_conflict(existing, digest), False


def _admit(row: TaskRow, now: datetime) -> None:
    """Admission, read from the task row the journal statement locked: no cancel can slip in
    between the check and the commit."""
    task_admission_check(
        condition=row.condition,
        cancellation=row.cancellation,
        paused=row.paused,
        deadline=row.deadline,
        now=now,
    )


def _same_intent_or_conflict(existing: Operation, digest: str) -> Operation:
    if existing.params_hash != digest and first_proposal_hash(existing) != digest:
        raise IdempotencyKeyReused(
            "this idempotency key was used with different parameters",
            operation=existing.pk,
        )
    return existing


def operation_get(actor: Actor, operation_id: str) -> Operation:
    """The operation if the actor may see its task; NotFound otherwise."""
    op = Operation.objects.filter(task_scope(actor, "task__"), pk=operation_id).first()
    if op is None:
        raise NotFound("no such operation")
    return op


def operation_get_for_agent(actor: Actor, operation_id: str, *, leased: bool = False) -> Operation:
    """The operation, for the agent that runs it over the API (claim, heartbeat, complete).

    NotFound when the actor may not see it; NotAuthorized unless the actor is the task's agent
    (``policy.can_claim``). With ``leased``: StaleLease for a worker-run operation, whose lease
    is only ever held by a worker, so no API call can heartbeat or complete it."""
    op = operation_get(actor, operation_id)
    can_claim(actor, op)
    if leased and op.executor != Operation.EXECUTOR_AGENT:
        raise StaleLease("this operation is run by the workers; no API claim holds its lease")
    return op


def operation_list(
    actor: Actor,
    *,
    task_id: str | None = None,
    status: str | None = None,
    after: tuple[datetime, str] | None = None,
    limit: int = 50,
) -> list[Operation]:
    if status and status not in S.ALL:
        raise InvalidInput(f"status must be one of {', '.join(S.ALL)}")
    qs: QuerySet[Operation] = Operation.objects.filter(task_scope(actor, "task__"))
    if task_id:
        qs = qs.filter(task_id=task_id)
    if status:
        qs = qs.filter(status=status)
    if after is not None:
        at, last_id = after
        qs = qs.filter(created_at__gt=at) | qs.filter(created_at=at, id__gt=last_id)
    return list(qs.order_by("created_at", "id")[:limit])


def invocations_of(operation: Operation) -> list[Invocation]:
    return invocations_by_operation([operation.pk])[operation.pk]


def invocations_by_operation(operation_ids: list[str]) -> dict[str, list[Invocation]]:
    """The invocations of a whole page of operations in one query (never one per row)."""
    found: dict[str, list[Invocation]] = {op_id: [] for op_id in operation_ids}
    for inv in Invocation.objects.filter(operation_id__in=operation_ids).order_by(
        "operation_id", "number"
    ):
        found[inv.operation_id].append(inv)
    return found


# --- acceptance ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """What one invocation produced, as the worker (or agent) reports it."""

    outcome: str  # succeeded | failed | unknown
    result: Any = None
    error_kind: str = ""  # transient | permanent (for failed)
    message: str = ""
    usage: dict[str, float] = field(default_factory=dict)
    receipt: dict[str, Any] | None = None
    provider_handle: str = ""


def backoff_delay(attempts_used: int, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter: uniform over [0, min(cap, base * 2^(n-1))] for the n-th retry. Pure."""
    envelope = min(cap, base * math.pow(2, max(0, attempts_used - 1)))
    return rng.uniform(0, envelope)


def operation_report(
    operation_id: str,
    *,
    lease_generation: int,
    lease_token: str,
    state_version: int,
    report: Report,
    execution_id: str | None,
    snapshot: Operation | None = None,
    actor: str | None = None,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Operation:
    """Accept an invocation's report under the claim it was issued.

    Preconditions: the reporter claimed the operation at ``lease_generation`` (and holds that
    claim's ``lease_token``) and read it at ``state_version``; ``snapshot``, when given, is the
    operation as that claim left it (the worker's copy: the common case then needs no read);
    no transaction is open. A stale, duplicate or forged report raises StaleLease after
    recording the rejected observation; nothing is changed. ``actor`` names the reporter in the
    journal (default: the execution).
    """
    now = now or timezone.now()
    rng = rng or random.Random()
    actor = actor or execution_actor(execution_id)
    try:
        try:
            with transaction.atomic():
                if snapshot is not None and _fast_acceptable(
                    snapshot, lease_generation, state_version
                ):
                    accepted = _accept_fast_txn(
                        snapshot, report, lease_token, now=now, actor=actor, rng=rng
                    )
                    if accepted is not None:
                        crash_point("report.before_commit")
                        return accepted
                op = _report_general_txn(
                    operation_id,
                    lease_generation,
                    lease_token,
                    state_version,
                    report,
                    now,
                    rng,
                    actor,
                )
        except hotpath.StoppedUnderLock:
            # A stop won the task row while the statement waited: the general path settles
            # the report for the stopping task.
            with transaction.atomic():
                op = _report_general_txn(
                    operation_id,
                    lease_generation,
                    lease_token,
                    state_version,
                    report,
                    now,
                    rng,
                    actor,
                )
    except StaleLease as exc:
        rejection_record(
            operation_id=operation_id,
            kind="stale_completion",
            lease_generation=lease_generation,
            state_version=state_version,
            execution_id=execution_id,
            actor=actor,
            detail={"outcome": report.outcome, "reason": str(exc)},
        )
        raise
    return op


def lease_report(
    lease: Lease, report: Report, *, execution_id: str | None, actor: str | None = None
) -> Operation:
    """``operation_report`` under ``lease``, the claim the call was made under (its operation
    is the snapshot), retried on contention. Preconditions as operation_report's; raises
    StaleLease as it does."""
    return contention_retry(
        lambda: operation_report(
            lease.operation_id,
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            state_version=lease.state_version,
            report=report,
            snapshot=lease.operation,
            execution_id=execution_id,
            actor=actor,
        )
    )


def _fast_acceptable(snapshot: Operation, lease_generation: int, state_version: int) -> bool:
    """Whether the claim's snapshot may decide the acceptance in one statement: it is the claim
    reported under, and nothing about the work needs the general writer (rules.general_writer:
    a compensation, a task with a ledger to settle)."""
    return (
        dialect.one_statement_forms()
        and snapshot.lease_generation == lease_generation
        and snapshot.state_version == state_version
        and general_writer_needed(ACCEPT, _accept_facts(snapshot)) is None
    )


def _accept_facts(
    op: Operation, decision: hotpath.Acceptance | None = None, *, form: str = ACCEPT
) -> FastFacts:
    """What an acceptance knows before it writes: the claim's snapshot and, once decided, the
    report's target and whether the one statement writes what the possible-effect rule would
    (runtime.statemachine.fast_ending_allowed)."""
    return FastFacts(
        compensates_id=op.compensates_id,
        attempts_used=op.attempts_used,
        budget=lambda: task_budget(op.task_id),
        target=None if decision is None else decision.target,
        ending_allowed=decision is None
        or fast_ending_allowed(op, decision.target, decision.invocation_outcome),
    )


class _Apart(Exception):
    """A hand-over's single transaction does not apply: it rolls back, and the acceptance and
    the claim run in transactions of their own."""


def operation_report_and_claim(
    lease: Lease, report: Report, next_id: str, *, execution_id: str
) -> tuple[Operation | None, Lease | Refusal]:
    """A drainer's hand-over: accept ``report`` under ``lease`` and claim ``next_id``, in one
    transaction (one commit where two would do) when both take their one-statement forms,
    else each in its own (operation_report, then operation_claim). Either way the same rows
    are written, by the same two writers; a difference is only how many commits carry them.
    Returns the accepted operation (None when the report was stale: its refusal is recorded, as
    operation_report records it) and the claim of ``next_id`` (a Refusal: nothing to claim).

    The transaction locks both operations and both tasks in the global order first
    (hotpath.lock_pair_txn), then runs the acceptance's writer and the claim's writer; a stop
    or pause found under the task's lock, a report the one statement does not cover, or a
    claim it does not cover rolls the whole transaction back and runs the two apart.

    Preconditions: ``lease`` is this worker's claim and ``report`` what its call returned; no
    transaction is open; ``next_id`` is a worker's call of a tool class without a concurrency
    limit (what a drainer's list of calls run alone holds: runtime.drainers).
    """
    actor = execution_actor(execution_id)
    op = lease.operation
    if _fast_acceptable(op, lease.lease_generation, lease.state_version):
        try:
            return contention_retry(
                lambda: _report_and_claim(lease, report, next_id, execution_id, actor)
            )
        except (_Apart, hotpath.StoppedUnderLock, hotpath.PausedUnderLock):
            pass
        except DatabaseError:
            # The claim's half failed and took the acceptance with it: the call made is still
            # accepted on its own below, so its effect does not wait for a lease takeover.
            log.warning("hand-over failed; accepting and claiming apart", exc_info=True)
    try:
        accepted: Operation | None = lease_report(
            lease, report, execution_id=execution_id, actor=actor
        )
    except StaleLease:
        accepted = None
    claimed = contention_retry(
        lambda: operation_claim(next_id, execution_id=execution_id, actor=actor)
    )
    return accepted, claimed


def _report_and_claim(
    lease: Lease, report: Report, next_id: str, execution_id: str, actor: str
) -> tuple[Operation, Lease]:
    now = timezone.now()
    with transaction.atomic(durable=True):
        hotpath.lock_pair_txn([lease.operation.pk, next_id])
        accepted = _accept_fast_txn(
            lease.operation, report, lease.lease_token, now=now, actor=actor, rng=random.Random()
        )
        if accepted is None:
            raise _Apart
        crash_point("handover.accepted")
        claimed = claim_fast_txn(
            next_id,
            execution_id=execution_id,
            executor=Operation.EXECUTOR_WORKER,
            actor=actor,
            now=now,
        )
        if claimed is None or tool_class_of(claimed.operation.tool) in settings.TOOL_CONCURRENCY:
            raise _Apart
    return accepted, claimed


def _report_general_txn(
    operation_id: str,
    lease_generation: int,
    lease_token: str,
    state_version: int,
    report: Report,
    now: datetime,
    rng: random.Random,
    actor: str,
) -> Operation:
    head = Operation.objects.filter(pk=operation_id).values("compensates_id").first()
    if head is None:
        raise StaleLease("no such operation", operation=operation_id)
    crash_point("report.after_read")
    # The global order: the operation (with the original a compensation settles, ascending id),
    # then the task, whose row the decision reads under its lock: a stop that committed first
    # is applied here; one still under way waits for this acceptance and settles what it left.
    operation_and_original_lock_txn(operation_id, head["compensates_id"])
    op = Operation.objects.select_for_update().get(pk=operation_id)
    if (
        op.status != S.RUNNING
        or op.lease_generation != lease_generation
        or op.state_version != state_version
        or not lease_token_matches(op, lease_token)
    ):
        raise StaleLease(
            "the lease is not the current one (generation, token or state version)",
            operation=operation_id,
        )
    op.task = Task.objects.select_for_update().get(pk=op.task_id)
    _apply_report_txn(op, report, now=now, actor=actor, rng=rng)
    crash_point("report.before_commit")
    return op


def _accept_fast_txn(
    snapshot: Operation,
    report: Report,
    lease_token: str,
    *,
    now: datetime,
    actor: str,
    rng: random.Random,
) -> Operation | None:
    """The common acceptance as one statement (PostgreSQL); None leaves it to the general path.
    The decision is made from the claim's snapshot, which the statement's guard (status,
    generation, state version, token) proves is still the row."""
    decision = report_decision(
        snapshot, report, adapter=adapters().get(snapshot.tool), stopping=False, now=now, rng=rng
    )
    if general_writer_needed(ACCEPT, _accept_facts(snapshot, decision)) is not None:
        # Rare, and a person must hear of it: the general path's writer notes an unresolved
        # call (runtime.statemachine, runtime.notify_events); an ending after an earlier call
        # is the writer's to decide (its possible-effect rule reads the calls).
        return None
    accepted = hotpath.accept_txn(
        snapshot,
        lease_token_digest=lease_token_digest(lease_token),
        acceptance=decision,
        actor=actor,
        now=now,
    )
    if accepted is None:
        return None
    op = copy.copy(snapshot)
    op.status = decision.target
    op.state_version += 1
    op.result, op.error = decision.result, decision.error
    op.next_attempt_at, op.lease_expires_at = decision.next_attempt_at, None
    return op


def _max_elapsed(op: Operation, adapter: ToolAdapter | None) -> datetime | None:
    """The end of the retry time allowance, counted from the first attempt (stored, so a
    replacement worker never gets a fresh allowance)."""
    seconds = adapter.max_elapsed_seconds if adapter is not None else None
    if seconds is None or op.first_attempt_at is None:
        return None
    return op.first_attempt_at + timedelta(seconds=seconds)


def report_decision(
    op: Operation,
    report: Report,
    *,
    adapter: ToolAdapter | None,
    stopping: bool,
    now: datetime,
    rng: random.Random,
    unconfirmed_before: bool = False,
) -> hotpath.Acceptance:
    """What one report does to a running operation (pure: from the operation as claimed, the
    tool's contract, whether its task is stopping, read under the task's lock, and whether an
    earlier call of it is unconfirmed). Both acceptance paths apply it."""
    contract = adapter.contract if adapter is not None else Contract.NONE
    result: Any = None
    next_at: datetime | None = None
    reason: str | None = None
    error: dict[str, Any] | None
    if report.outcome == "succeeded":
        target, result, error = S.SUCCEEDED, report.result, None
        invocation_outcome = Invocation.OUTCOME_SUCCEEDED
    elif report.outcome == "failed" and report.error_kind == ToolFailure.PERMANENT:
        target = S.FAILED
        error = {"kind": "permanent", "message": report.message}
        invocation_outcome = Invocation.OUTCOME_FAILED_PERMANENT
    elif report.outcome == "unknown" and contract == Contract.NONE:
        # The effect may have happened and the receiver offers no way to tell or to dedupe:
        # a person decides, with the invocations as evidence. Never invoked again by a machine.
        target = S.UNRESOLVED
        error = {"kind": "unknown", "message": report.message}
        invocation_outcome = Invocation.OUTCOME_UNKNOWN
    else:
        # A transient failure; or an unknown outcome where repeating under the same key is safe
        # (replay: the receiver returns the first result; lookup: the next attempt asks first).
        transient = report.outcome == "failed"
        invocation_outcome = (
            Invocation.OUTCOME_FAILED_TRANSIENT if transient else Invocation.OUTCOME_UNKNOWN
        )
        error = {"kind": "transient" if transient else "unknown", "message": report.message}
        delay = backoff_delay(
            op.attempts_used, settings.RETRY_BASE_SECONDS, settings.RETRY_CAP_SECONDS, rng
        )
        retry_at = now + timedelta(seconds=delay)
        elapsed_limit = _max_elapsed(op, adapter)
        if op.attempts_used >= op.max_attempts:
            target = S.FAILED
            error["message"] = f"{report.message} (attempts exhausted: {op.attempts_used})"
        elif op.deadline is not None and retry_at >= op.deadline and not op.compensates_id:
            target = S.FAILED
            error["message"] = f"{report.message} (no retry fits before the deadline)"
        elif elapsed_limit is not None and retry_at >= elapsed_limit:
            target = S.FAILED
            error["message"] = f"{report.message} (retry time allowance used up)"
        else:
            target, next_at = S.RETRY_SCHEDULED, retry_at
        if target == S.FAILED and report.outcome == "unknown":
            # Out of retries with the effect still unconfirmed: not a failure anyone can assert.
            target = S.UNRESOLVED
    if target == S.FAILED and op.compensates_id:
        # A compensation that cannot finish is handed to a person, never lost as "failed".
        target = S.UNRESOLVED
    if target == S.RETRY_SCHEDULED and stopping and not op.compensates_id:
        # Nothing is retried for a stopping task: work that failed is simply cancelled; an
        # outcome nobody can confirm (this call's or an earlier one's) stays with a person
        # (runtime.stoprule: unless repeating it is harmless).
        next_at = None
        unconfirmed = report.outcome == "unknown" or unconfirmed_before
        target = stop_target(op.tool, unconfirmed=unconfirmed)
        reason = "stopped with the task"
    data: dict[str, Any] = {
        "lease_generation": op.lease_generation,
        "attempts_used": op.attempts_used,
    }
    if op.cancel_requested or stopping:
        # The result committed before any stop could end the call: it wins, and says so.
        data["completed_after_cancel_request"] = True
    if report.usage:
        data["usage"] = dict(report.usage)
    if next_at is not None:
        data["retry_at"] = next_at.isoformat()
    if error:
        data["error"] = error
    return hotpath.Acceptance(
        target=target,
        edge=OPERATION.check(S.RUNNING, target),
        result=result,
        error=error,
        next_attempt_at=next_at,
        invocation_outcome=invocation_outcome,
        receipt=report.receipt,
        provider_handle=report.provider_handle,
        data=data,
        status_reason=reason,
    )


def _apply_report_txn(
    op: Operation, report: Report, *, now: datetime, actor: str, rng: random.Random
) -> None:
    """The general acceptance: the decision applied through the guarded writer with everything
    that must commit with it (invocation receipt, journal event, next outbox row, and what the
    settling sets in motion: saga steps, a stopping task's quiescence)."""
    # ``op.task`` was read under its row lock (_report_general_txn).
    stopping = task_stopping(op.task)
    decision = report_decision(
        op,
        report,
        adapter=adapters().get(op.tool),
        stopping=stopping,
        now=now,
        rng=rng,
        unconfirmed_before=stopping
        and op.pk in unconfirmed_calls_txn([op.pk], before=op.attempts_used),
    )
    generation = op.lease_generation
    fields: dict[str, Any] = {
        "result": decision.result,
        "error": decision.error,
        "next_attempt_at": decision.next_attempt_at,
        "lease_expires_at": None,
    }
    if decision.status_reason is not None:
        fields["status_reason"] = decision.status_reason
    # The reported call's outcome first: the writer's possible-effect rule reads the calls, and
    # this one is confirmed (or not) by this very report. The operation's row is held (read
    # for update above), so no other writer sees the call answered before the transition.
    Invocation.objects.filter(operation=op, lease_generation=generation).update(
        outcome=decision.invocation_outcome,
        finished_at=now,
        receipt=decision.receipt,
        provider_handle=decision.provider_handle[:300],
    )
    transitioned = operation_transition_txn(
        op,
        decision.target,
        now=now,
        fields=fields,
        lease_generation=generation,
        actor=actor,
        data=decision.data,
    )
    # Limits: observed usage replaces the hold (once per invocation; unknown stays apart).
    _settle_budget_txn(op, report, decision, now=now, actor=actor)
    if decision.target == S.RETRY_SCHEDULED and op.executor == Operation.EXECUTOR_WORKER:
        # Agent-run work is claimed by its agent over the API, never announced to workers.
        outbox_enqueue_txn(
            topic=TOPIC_EXECUTE,
            operation_id=op.pk,
            now=now,
            available_at=decision.next_attempt_at,
        )
    operation_settled_txn(op, transitioned.task, now=now, actor=actor)


def _settle_budget_txn(
    op: Operation, report: Report, decision: hotpath.Acceptance, *, now: datetime, actor: str
) -> None:
    budget = task_budget(op.task_id)
    if not budget:
        return
    unknown = decision.invocation_outcome == Invocation.OUTCOME_UNKNOWN
    budget_settle_txn(
        budget=budget,
        op=op,
        number=op.attempts_used,
        usage=report.usage,
        outcome="unknown" if unknown else report.outcome,
        final=decision.target != S.RETRY_SCHEDULED,
        source="agent" if op.executor == Operation.EXECUTOR_AGENT else "adapter",
        actor=actor,
        now=now,
        repeats_lost_call=contract_of(op.tool) in (Contract.REPLAY, Contract.LOOKUP),
    )


def agent_report(
    op: Operation, *, lease_generation: int, lease_token: str, report: Report, actor: str
) -> Operation:
    """An agent's completion of an operation it claimed. A repeat of a completion that was
    already accepted under the same claim returns the operation unchanged; any other report
    (an old generation, another claim's token, a lease the sweeper took back) is refused with
    StaleLease and recorded.

    Preconditions: the actor may see the operation and is its executor; no transaction open.
    """
    current = Operation.objects.get(pk=op.pk)
    if (
        current.lease_generation == lease_generation
        and current.status != S.RUNNING
        and lease_token_matches(current, lease_token)
        and Invocation.objects.filter(
            operation=current, lease_generation=lease_generation, outcome__in=_REPORTED
        ).exists()
    ):
        return current
    operation_report(
        op.pk,
        lease_generation=lease_generation,
        lease_token=lease_token,
        state_version=current.state_version,
        report=report,
        execution_id=current.execution_id,
        actor=actor,
    )
    return Operation.objects.get(pk=op.pk)


# Invocation outcomes that only an accepted report writes (the sweeper writes ``lost``).
_REPORTED = (
    Invocation.OUTCOME_SUCCEEDED,
    Invocation.OUTCOME_FAILED_TRANSIENT,
    Invocation.OUTCOME_FAILED_PERMANENT,
    Invocation.OUTCOME_UNKNOWN,
)


def operations_report_batch(
    reports: list[tuple[Operation, Report]],
    *,
    lease_token: str,
    execution_id: str,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> dict[str, str]:
    """Accept the reports of one batch claim (``runtime.leases.operations_claim_batch``), each
    with the claim's snapshot of its operation, in one transaction where the common case
    applies; every other report goes through ``operation_report`` on its own afterwards (a
    stale one is recorded and refused there). Returns each operation's outcome: the report's
    outcome, or ``"rejected"``.

    Preconditions: no transaction is open; every snapshot is the batch claim's (status running
    under ``lease_token``)."""
    now = now or timezone.now()
    rng = rng or random.Random()
    actor = execution_actor(execution_id)
    decided = [
        (
            op,
            report_decision(
                op, report, adapter=adapters().get(op.tool), stopping=False, now=now, rng=rng
            ),
        )
        for op, report in reports
    ]
    # An unresolved outcome goes through the one-operation path below, whose writer notes it
    # for support staff (runtime.notify_events), as does an ending the writer's possible-effect
    # rule must decide (runtime.statemachine.fast_ending_allowed).
    decided = [
        (op, d)
        for op, d in decided
        if general_writer_needed(ACCEPT_BATCH, _accept_facts(op, d)) is None
    ]

    def accept() -> set[str]:
        try:
            with transaction.atomic(durable=True):
                ids = set(
                    hotpath.accept_batch_txn(
                        decided,
                        lease_token_digest=lease_token_digest(lease_token),
                        actor=actor,
                        now=now,
                    )
                )
                crash_point("report.batch_before_commit")
        except hotpath.BatchStopped:
            return set()
        return ids

    # Contention (a deadlock or serialization failure the database broke by rolling this
    # transaction back) is retried as the one-operation path's is: otherwise the whole batch
    # would stay running until its leases expired.
    accepted = contention_retry(accept)
    outcomes: dict[str, str] = {}
    for op, report in reports:
        if op.pk in accepted:
            outcomes[op.pk] = report.outcome
            continue
        try:
            contention_retry(
                functools.partial(
                    operation_report,
                    op.pk,
                    lease_generation=op.lease_generation,
                    lease_token=lease_token,
                    state_version=op.state_version,
                    report=report,
                    execution_id=execution_id,
                    snapshot=op,
                    now=now,
                    rng=rng,
                )
            )
            outcomes[op.pk] = report.outcome
        except StaleLease:
            outcomes[op.pk] = "rejected"
    return outcomes
