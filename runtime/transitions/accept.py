"""The acceptance of a report (``operation_report``; an agent's ``agent_report``): result, status,
invocation receipt, journal event and the next outbox row commit together, fenced on lease
generation, token and state version, or not at all. The general writer (``_apply_report_txn``)
takes the guarded status writer with every side effect (ledger, saga steps, a stopping task's
rest); ``accept_txn`` (``accept_one``) covers what ``runtime.rules.general_writer`` leaves it."""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime.actors import execution_actor
from runtime.budgets import budget_settle_txn, task_budget
from runtime.compensation import operation_and_original_lock_txn
from runtime.crashpoints import crash_point
from runtime.db import contention_retry, fetchone_named, prepared_cursor
from runtime.errors import StaleLease
from runtime.events import TaskRow, task_row
from runtime.models import Invocation, Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn, outbox_payload
from runtime.reactor import operation_settled_txn
from runtime.rules.general_writer import ACCEPT, general_writer_needed
from runtime.rules.statuses import OperationStatus
from runtime.sqlfiles import queries
from runtime.stoprule import task_stopping, unconfirmed_calls_txn
from runtime.tools import Contract, adapters, contract_of
from runtime.transitions.accept_decision import (
    Acceptance,
    Report,
    accept_facts,
    fast_acceptable,
    report_decision,
)
from runtime.transitions.fast import (
    SLOTS,
    StoppedUnderLock,
    deltas_params,
    hint_after_commit,
    publish_after_commit,
)
from runtime.transitions.lease import Lease, lease_token_digest, lease_token_matches
from runtime.transitions.rejections import rejection_record
from runtime.transitions.status import operation_transition_txn

S = OperationStatus

_SQL = queries("accept_one", slots=SLOTS)


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
    # (Looked up at each call: the simulation's plants replace the general writer.)
    general = functools.partial(
        _report_general_txn,
        operation_id,
        lease_generation,
        lease_token,
        state_version,
        report,
        now,
        rng,
        actor,
    )
    try:
        fence = (lease_generation, state_version, lease_token)
        return _fast_or_general(snapshot, report, fence, general, now=now, actor=actor, rng=rng)
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


def _fast_or_general(
    snapshot: Operation | None,
    report: Report,
    fence: tuple[int, int, str],
    general: Callable[[], Operation],
    *,
    now: datetime,
    actor: str,
    rng: random.Random,
) -> Operation:
    """The one statement where the claim's snapshot may decide, and the general writer in the
    same transaction otherwise; the general writer again, in a transaction of its own, when a
    stop won the task row while the statement waited (it settles the report for the stopping
    task)."""
    generation, version, lease_token = fence
    try:
        with transaction.atomic():
            if snapshot is not None and fast_acceptable(snapshot, generation, version):
                accepted = accept_fast_txn(
                    snapshot, report, lease_token, now=now, actor=actor, rng=rng
                )
                if accepted is not None:
                    crash_point("report.before_commit")
                    return accepted
            return general()
    except StoppedUnderLock:
        with transaction.atomic():
            return general()


def lease_report(
    lease: Lease, report: Report, *, execution_id: str | None, actor: str | None = None
) -> Operation:
    """``operation_report`` under ``lease``, the claim the call was made under (its operation is
    the snapshot), retried on contention. Preconditions and StaleLease as operation_report's."""
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


def accept_fast_txn(
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
    if general_writer_needed(ACCEPT, accept_facts(snapshot, decision)) is not None:
        # Rare, and a person must hear of it: the general writer notes an unresolved call, and
        # decides an ending after an earlier call (its possible-effect rule reads the calls).
        return None
    accepted = accept_txn(
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


def accept_txn(
    op: Operation,
    *,
    lease_token_digest: str,
    acceptance: Acceptance,
    actor: str,
    now: datetime,
) -> TaskRow | None:
    """Accept a report on a covered operation of an unstopped task in one statement. ``op`` is
    the claim's snapshot (status running at its generation and state version). Returns the
    task as the statement left it, or None when the row moved on, the task is stopping, or the
    operation is a compensation (or the decision needs a reason recorded, which only a stopping
    task gives): nothing was written and the caller takes the general path. Raises
    StoppedUnderLock when a stop committed while the statement waited for the task."""
    announce = acceptance.target == S.RETRY_SCHEDULED and op.executor == Operation.EXECUTOR_WORKER
    params = {
        "id": op.pk,
        "target": acceptance.target,
        "generation": op.lease_generation,
        "state_version": op.state_version,
        "digest": lease_token_digest,
        "result": None if acceptance.result is None else Jsonb(acceptance.result),
        "error": None if acceptance.error is None else Jsonb(acceptance.error),
        "next_at": acceptance.next_attempt_at,
        "inv_outcome": acceptance.invocation_outcome,
        "receipt": None if acceptance.receipt is None else Jsonb(acceptance.receipt),
        "handle": acceptance.provider_handle[:300],
        "announce": announce,
        "outbox_payload": outbox_payload(),
        "now": now,
        "event_type": f"operation.{acceptance.edge}",
        "actor": actor,
        "event_data": Jsonb(
            {"from": S.RUNNING, "to": acceptance.target, "status": acceptance.target}
            | acceptance.data
        ),
        **deltas_params(S.RUNNING, acceptance.target),
    }
    with prepared_cursor() as cur:
        cur.execute(_SQL["accept_one"], params)  # type: ignore[arg-type]
        row = fetchone_named(cur)
    if row is None:
        return None
    task = task_row(row)
    if task_stopping(task):
        raise StoppedUnderLock
    hint_after_commit(task, f"operation.{acceptance.edge}", op, actor, {"to": acceptance.target})
    publish_after_commit(row["outbox_id"], op, acceptance.next_attempt_at or now, now)
    return task


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
    op: Operation, report: Report, decision: Acceptance, *, now: datetime, actor: str
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

    Preconditions: the actor may see the operation and is its executor; no transaction open."""
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
