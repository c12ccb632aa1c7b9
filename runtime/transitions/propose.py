"""The proposal of a tool operation (``operation_propose``, its own transaction;
``operation_propose_txn``, the caller's): validated, keyed, admitted under the task's row lock,
announced to the workers. The general writer inserts through ``operation_insert_txn``
(runtime.transitions.insert); the one-statement form (``propose_txn``, ``propose_one`` in
``runtime/sql/propose.sql``) checks admission inside its statement. A wait or a timer is
proposed by ``runtime.transitions.propose_wait``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime import dialect
from runtime.actors import Actor
from runtime.admission import queue_admit_txn, queue_limited
from runtime.approval_gate import MAX_APPROVAL_TIMEOUT_SECONDS, approval_request_txn
from runtime.attempts import AttemptMoved, attempt_bound, attempt_unmoved_txn
from runtime.budgets import budget_remember, budget_reserve_txn
from runtime.db import durable_statement, fetchone_named, prepared_cursor, refusal_code
from runtime.drainers import call_drained_singly, call_quick
from runtime.errors import (
    IdempotencyKeyReused,
    InvalidInput,
    NotFound,
    RequestInProgress,
    UnknownTool,
)
from runtime.events import TaskRow, task_row
from runtime.hashing import params_hash
from runtime.models import Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn, outbox_payload
from runtime.policy import can_propose
from runtime.rules.admission import admission_refused, task_admission_check
from runtime.rules.general_writer import PROPOSE, FastFacts, general_writer_needed
from runtime.rules.statuses import OperationStatus
from runtime.selectors.approvals import first_proposal_hash
from runtime.selectors.tasks import task_for_proposal
from runtime.specs import OperationSpec
from runtime.sqlfiles import queries
from runtime.tasks import given_key_validate, operation_by_legacy_key, operation_key
from runtime.text import name_check
from runtime.tools import ToolAdapter, adapter_for
from runtime.tracing import annotate, span
from runtime.transitions.fast import SLOTS, deltas_params, hint_after_commit, publish_after_commit
from runtime.transitions.insert import operation_insert_txn
from runtime.transitions.propose_wait import wait_propose

S = OperationStatus

_SQL = queries("propose_one", slots=SLOTS)


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
    # The proposal's span (runtime.tracing): the outbox row keeps its context, so the claim,
    # the tool call and the acceptance are its children wherever they run.
    with span("operation.propose", task_id=task_id, tool=spec.tool, step=spec.step) as current:
        if spec.kind in (Operation.KIND_WAIT_SIGNAL, Operation.KIND_TIMER):
            op, created = wait_propose(actor, task_id, spec)
        else:
            _validate(spec)
            op, created = attempt_bound(lambda: _propose(actor, task_id, spec, in_caller=in_caller))
        annotate(current, operation_id=op.pk, created=created)
        return op, created


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
    task, adapter = _task_and_tool(actor, task_id, spec)
    key, digest, derived = _keyed(task, adapter, spec)
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
    op = _built(task, adapter, spec, key, digest)
    now = timezone.now()
    fast = FastFacts(gated=op.approval_required, budget=lambda: task.budget)
    if dialect.one_statement_forms() and general_writer_needed(PROPOSE, fast) is None:
        if _propose_fast(op, actor, now, in_caller=in_caller):
            return op, True
    else:
        existing = Operation.objects.filter(task=task, idempotency_key=key).first()
        if existing is not None:
            return _same_intent_or_conflict(existing, digest), False
        if _propose_general(op, task, adapter, spec, actor, now, in_caller=in_caller):
            return op, True
    existing = Operation.objects.filter(task=task, idempotency_key=key).first()
    if existing is None:
        raise RequestInProgress("a proposal under this key is in progress; retry")
    return _same_intent_or_conflict(existing, digest), False


def _task_and_tool(actor: Actor, task_id: str, spec: OperationSpec) -> tuple[Task, ToolAdapter]:
    """The task (NotFound, NotAuthorized) and the tool the actor may propose into it, with the
    parameters the tool validated."""
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
    return task, adapter


def _keyed(task: Task, adapter: ToolAdapter, spec: OperationSpec) -> tuple[str, str, str]:
    """The proposal's idempotency key (in the owner's namespace), its parameters' hash, and the
    key derived from the proposal ("" when one was given)."""
    # A new attempt is a new pursuit: its derived keys carry the attempt number.
    attempt_number = getattr(task, "attempt_number", None) or 1
    derived = spec.idempotency_key or adapter.key_for(
        task.pk, spec.step, spec.params, spec.intent_version, attempt=attempt_number
    )
    key = operation_key(task, derived)  # another owner's namespace first: 403
    if spec.idempotency_key and not spec.key_derived:
        given_key_validate(spec.idempotency_key)
    derived = "" if spec.idempotency_key else derived
    return key, params_hash(spec.params), derived


def _built(
    task: Task, adapter: ToolAdapter, spec: OperationSpec, key: str, digest: str
) -> Operation:
    """The new operation, unsaved: waiting for its approval when the tool's policy gates it."""
    gated = adapter.requires_approval(spec.params)
    if spec.approval_timeout_seconds is not None and not (
        1 <= spec.approval_timeout_seconds <= MAX_APPROVAL_TIMEOUT_SECONDS
    ):
        raise InvalidInput(
            f"approval_timeout_seconds must be between 1 and {MAX_APPROVAL_TIMEOUT_SECONDS}"
        )
    return Operation(
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
        status=S.WAITING_APPROVAL if gated else S.PENDING,
        approval_required=gated,
        max_attempts=spec.max_attempts or adapter.max_attempts,
        estimate=spec.estimate,
        signal=spec.signal,
        timeout_seconds=spec.timeout_seconds,
        deadline=task.deadline,
    )


def _propose_fast(op: Operation, actor: Actor, now: datetime, *, in_caller: bool) -> bool:
    """One statement: INSERT ... ON CONFLICT DO NOTHING with the event and the outbox row,
    admission checked inside it under the task's row lock (a refusal fails the statement, which
    then wrote nothing); _statement_block says in which transaction. False when an operation of
    the same key exists (nothing written). (A task with a budget declines to the general path,
    whose guarded meter UPDATEs hold the estimate in the same transaction.)"""
    moved = False
    with _statement_block(op.tool, in_caller=in_caller):
        # Limits: a tool class at its queue capacity refuses before anything is written.
        queue_admit_txn(op.tool)
        try:
            row = propose_txn(op, actor=actor.label, now=now)
        except AttemptMoved:
            # Raised once the block is left: it wrote nothing and failed no statement, and
            # raised through a block without a savepoint it would doom the transaction.
            moved = True
    if moved:
        raise AttemptMoved
    return row is not None


def _propose_general(
    op: Operation,
    task: Task,
    adapter: ToolAdapter,
    spec: OperationSpec,
    actor: Actor,
    now: datetime,
    *,
    in_caller: bool,
) -> bool:
    """The general writer: the insert, admission read from the task row the journal locked,
    the estimate held, the approval requested or the work announced. False when a concurrent
    proposal with the same key won the unique constraint (its row is read by the caller, in
    the same transaction: a savepoint inside the caller's)."""
    try:
        with transaction.atomic(durable=not in_caller):
            # Limits: a tool class at its queue capacity refuses before anything is written.
            queue_admit_txn(spec.tool)
            # The attempt is read under the task's lock (taken before the insert: the new
            # operation row is nobody else's yet, so the lock order is kept).
            attempt_unmoved_txn(task.pk, op.attempt_id)
            data = {"tool": spec.tool, "step": spec.step, "status": op.status, "kind": spec.kind}
            _admit(operation_insert_txn(op, actor=actor.label, now=now, data=data), now)
            # Limits: hold the estimate in the attempt's ledger (no statement unbudgeted).
            budget_reserve_txn(budget=task.budget, op=op, number=0, now=now)
            if op.approval_required:
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
    except IntegrityError:
        return False
    return True


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


def propose_txn(op: Operation, *, actor: str, now: datetime) -> TaskRow | None:
    """Insert a new pending operation (built, unsaved, by the caller) with its event and, for
    worker-run work, its outbox row, in one statement, which checks admission on the task row it
    locked (rules.admission.ADMISSION_REFUSALS) and fails, writing nothing, when the task
    refuses: TaskRefused; AttemptMoved when the task's current attempt is no longer
    ``op.attempt_id`` under the lock (the statement wrote nothing but did not fail). None when
    an operation with the same key exists already (nothing written: the caller compares
    parameter hashes). Runs inside the caller's transaction, or as its own (autocommit); its
    announcement goes out after that commit."""
    announce = op.executor == Operation.EXECUTOR_WORKER
    # A call goes to its queue's drainer when one is registered (runtime.drainers): a quick one
    # to be claimed in a batch, another to be run one at a time.
    quick = announce and call_quick(op.tool, op.params)
    single = announce and not quick and call_drained_singly(op.tool, op.kind)
    params = _propose_params(op, announce=announce, actor=actor, now=now)
    try:
        with prepared_cursor() as cur:
            cur.execute(_SQL["propose_one"], params)  # type: ignore[arg-type]
            row = fetchone_named(cur)
    except DatabaseError as exc:
        code = refusal_code(exc)
        if code is None:
            raise
        raise admission_refused(code) from None
    if row is None:
        return None
    if row["id"] is None:
        # The attempt moved: the statement wrote nothing and did not fail, so the caller's
        # transaction stays usable for the proposal made again under the new attempt.
        raise AttemptMoved
    task = task_row(row)
    op.state_version = 1
    op.created_at = op.updated_at = now
    hint_after_commit(task, "operation.proposed", op, actor)
    publish_after_commit(row["outbox_id"], op, now, now, drained=quick or single, single=single)
    return task


def _propose_params(op: Operation, *, announce: bool, actor: str, now: datetime) -> dict[str, Any]:
    """The proposal statement's parameters: the new row's columns, its event's, and whether
    it is announced (worker-run work)."""
    return {
        "id": op.pk,
        "task_id": op.task_id,
        "attempt_id": op.attempt_id,
        "kind": op.kind,
        "tool": op.tool,
        "tool_version": op.tool_version,
        "step": op.step,
        "intent_version": op.intent_version,
        "params": Jsonb(op.params),
        "params_hash": op.params_hash,
        "key": op.idempotency_key,
        "executor": op.executor,
        "max_attempts": op.max_attempts,
        "deadline": op.deadline,
        "estimate": Jsonb(op.estimate),
        "signal": op.signal,
        "timeout_seconds": op.timeout_seconds,
        "announce": announce,
        "outbox_payload": outbox_payload(),
        "now": now,
        "event_type": "operation.proposed",
        "actor": actor,
        "event_data": Jsonb(
            {"tool": op.tool, "step": op.step, "status": S.PENDING, "kind": op.kind}
        ),
        **deltas_params(None, S.PENDING),
    }
