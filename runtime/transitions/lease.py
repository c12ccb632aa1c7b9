"""Leases and fencing. A claim sets the owner execution, ``lease_generation + 1``, the expiry and
the digest of a fresh lease token in one guarded UPDATE; heartbeats and reports must present both
the generation and the token, so a lease belongs to the execution that claimed it; expiry hands
the work to a new generation (re-checked in the takeover's own statement) but never proves the
old owner stopped. Here: the lease itself (``Lease``, its length, its token's digest, the clock
it runs on), the heartbeat, the sweeper's takeover of an expired lease, and the cancel flag a
heartbeat reads.

Lock order (DESIGN.md, README): operation rows in ascending id, then the task row."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from runtime import dialect
from runtime.actors import SWEEPER
from runtime.budgets import budget_mark_unknown_txn
from runtime.crashpoints import crash_point
from runtime.db import db_datetime, fetchone_named
from runtime.errors import StaleLease, TransitionRejected
from runtime.events import event_append_txn
from runtime.lease_tokens import lease_token_digest as _derived_digest
from runtime.models import Invocation, Operation, Task
from runtime.outbox import TOPIC_EXECUTE, outbox_enqueue_txn
from runtime.reactor import operation_settled_txn
from runtime.rules.statuses import OperationStatus
from runtime.sqlfiles import queries
from runtime.stoprule import stop_asked, stop_covers, stop_reason, stop_target, task_stopping
from runtime.tools import Contract, contract_of
from runtime.transitions.rejections import rejection_record
from runtime.transitions.status import operation_transition_txn

S = OperationStatus


# The heartbeat, one form per dialect (runtime/sql/lease.sql).
_SQL = queries("lease_heartbeat", "lease_heartbeat_database_clock", slots={"running": S.RUNNING})


@dataclass(frozen=True)
class Lease:
    operation_id: str
    lease_generation: int
    state_version: int
    lease_expires_at: datetime
    invocation_number: int
    operation: Operation
    # The claim's secret: shown to the claimant, kept nowhere (runtime.lease_tokens).
    lease_token: str


def lease_seconds() -> int:
    return int(settings.LEASE_SECONDS)


def lease_token_digest(token: str) -> str:
    """What fencing compares (a token of a dropped key matches nothing): runtime.lease_tokens."""
    return _derived_digest(token)


def lease_token_matches(op: Operation, token: str) -> bool:
    return bool(op.lease_token_digest) and hmac.compare_digest(
        op.lease_token_digest, lease_token_digest(token)
    )


def lease_expiry(op: Operation) -> datetime:
    """The expiry a claim statement wrote on the database's clock (returned with the row)."""
    assert op.lease_expires_at is not None
    return op.lease_expires_at


def lease_clock(now: datetime | None) -> Any:
    """What a takeover compares a lease's expiry with: the database's clock (PostgreSQL), the
    process clock in the embedded mode; an explicit ``now`` stands for that clock (tests)."""
    if now is not None:
        return now
    return Now() if dialect.database_clock() else timezone.now()


def lease_heartbeat(
    operation_id: str, lease_generation: int, lease_token: str, now: datetime | None = None
) -> tuple[datetime, bool]:
    """Extend the lease under the caller's claim (generation and token); returns (new expiry,
    asked to stop: ``stoprule.stop_asked``, so a compensation is not asked to stop by its task's
    stop). Raises StaleLease when the claim is no longer the current one.

    A heartbeat that commits before the sweeper's takeover keeps the lease: the takeover
    re-checks the expiry in its own statement."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        # One statement: extend under the claim and read the stop flags in the same breath.
        # On PostgreSQL the expiry is the database's clock plus the lease, never the caller's
        # ``now`` (a worker's clock, maybe skewed against the sweeper's host).
        cur.execute(
            _SQL["lease_heartbeat_database_clock"]
            if dialect.database_clock()
            else _SQL["lease_heartbeat"],
            {
                "expires": now + timedelta(seconds=lease_seconds()),
                "seconds": lease_seconds(),
                "id": operation_id,
                "generation": lease_generation,
                "digest": lease_token_digest(lease_token),
            },
        )
        row = fetchone_named(cur)
    if row is None:
        rejection_record(
            operation_id=operation_id,
            kind="stale_heartbeat",
            lease_generation=lease_generation,
            detail={},
        )
        raise StaleLease("the lease is not the current one", operation=operation_id)
    expires = db_datetime(row["lease_expires_at"])
    assert expires is not None
    asked = stop_asked(
        cancel_requested=bool(row["cancel_requested"]),
        covered=stop_covers(row["compensates_id"]),
        cancellation=row["cancellation"],
        condition=row["condition"],
    )
    return expires, asked


def lease_expire_sweep(now: datetime | None = None, batch: int = 200) -> int:
    """Take over running operations whose lease expired. The work becomes claimable again (a new
    generation at the next claim), the invocation is marked lost, attempts stay used. Where
    invoking again could repeat an effect nobody can confirm (no receiver contract, or the task
    is stopping), the operation goes to a person instead. The takeover re-checks the expiry in
    its guarded statement, so a heartbeat that committed after the read keeps its lease.

    Locks: the operation row, then its task's (the global order); the target is decided from
    the task read under its lock, so a stop that committed first is seen, and one still under
    way waits for the takeover and then settles what it left (runtime.stoprule)."""
    clock = lease_clock(now)  # leases run on the database's clock
    now = now or timezone.now()
    expired_ids = list(
        Operation.objects.filter(status=S.RUNNING, lease_expires_at__lt=clock)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:batch]
    )
    taken = 0
    for op_id in expired_ids:
        crash_point("sweep.after_read")
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update()
                .filter(pk=op_id, status=S.RUNNING, lease_expires_at__lt=clock)
                .first()
            )
            if op is None:
                continue
            op.task = Task.objects.select_for_update().get(pk=op.task_id)
            generation = op.lease_generation
            target, reason = _takeover_target(op, op.task)
            try:
                transitioned = operation_transition_txn(
                    op,
                    target,
                    now=now,
                    actor=SWEEPER,
                    fields={"lease_expires_at": None, "status_reason": reason},
                    lease_generation=generation,
                    where={"lease_expires_at__lt": clock},
                    data={"lease_generation": generation, "reason": reason},
                    event_type="operation.lease_expired",
                )
            except (TransitionRejected, StaleLease):
                continue
            Invocation.objects.filter(
                operation=op, lease_generation=generation, outcome__isnull=True
            ).update(outcome=Invocation.OUTCOME_LOST, finished_at=now)
            # Limits: the lost call's usage is unknown, never free.
            budget_mark_unknown_txn(budget=op.task.budget, op=op, actor=SWEEPER, now=now)
            if target == S.PENDING and op.executor == Operation.EXECUTOR_WORKER:
                outbox_enqueue_txn(topic=TOPIC_EXECUTE, operation_id=op.pk, now=now)
            elif target != S.PENDING:
                operation_settled_txn(op, transitioned.task, now=now, actor=SWEEPER)
            taken += 1
    return taken


def _takeover_target(op: Operation, task: Task) -> tuple[str, str]:
    """Where expired work goes. ``task`` was read under its row lock."""
    if contract_of(op.tool) == Contract.NONE:
        # With no receiver contract, a dispatched call whose worker went silent may or may
        # not have taken effect, and invoking again could repeat it: a person decides.
        return (
            S.UNRESOLVED,
            "lease expired with the outcome unconfirmed; the receiver cannot be asked",
        )
    if task_stopping(task) and stop_covers(op.compensates_id):
        # No covered work is re-admitted for a stopping task, and the lost call is unconfirmed:
        # only a pure call is simply cancelled; any other outcome stays with a person.
        why = f"lease expired after the stop ({stop_reason(task)})"
        if stop_target(op.tool, unconfirmed=True) == S.CANCELLED:
            return S.CANCELLED, why
        return S.UNRESOLVED, f"{why}; the outcome is unconfirmed"
    return S.PENDING, "lease expired"


def cancel_requested_txn(
    task_id: str, locked: list[Operation], *, now: datetime, actor: str, reason: str
) -> list[str]:
    """Ask the task's running covered operations to stop (they learn it from their heartbeat),
    journalling the request for each, inside the caller's transaction. The operations' state
    versions do not move: a result that arrives anyway is still accepted and kept.

    Preconditions: ``locked`` are the task's live operations, locked (in ascending id) before
    the task row and read under those locks; only they are touched (an operation updated
    without its lock while the task row is held would deadlock with its own report)."""
    running = [
        (op.pk, op.state_version)
        for op in sorted(locked, key=lambda o: o.pk)
        if op.status == S.RUNNING and stop_covers(op.compensates_id) and not op.cancel_requested
    ]
    if not running:
        return []
    Operation.objects.filter(pk__in=[pk for pk, _ in running]).update(cancel_requested=True)
    for pk, version in running:
        event_append_txn(
            task_id=task_id,
            type="operation.cancel_requested",
            state_version=version,
            now=now,
            operation_id=pk,
            actor=actor,
            data={"reason": reason},
        )
    return [pk for pk, _ in running]
