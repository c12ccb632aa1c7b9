"""A drainer's hand-over: the acceptance of one call and the claim of the next in one transaction
(one commit where two would do), both in their one-statement forms, after locking both
operations and both tasks in the global order (``lock_pair`` in ``runtime/sql/handover.sql``);
otherwise each in its own."""

from __future__ import annotations

import logging
import random

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from runtime.actors import execution_actor
from runtime.admission import tool_class_of
from runtime.crashpoints import crash_point
from runtime.db import contention_retry, prepared_cursor
from runtime.errors import StaleLease
from runtime.models import Operation
from runtime.rules.statuses import OperationStatus
from runtime.sqlfiles import queries
from runtime.transitions.accept import accept_fast_txn, lease_report
from runtime.transitions.accept_decision import Report, fast_acceptable
from runtime.transitions.claim import claim_fast_txn, operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.fast import SLOTS, PausedUnderLock, StoppedUnderLock
from runtime.transitions.lease import Lease

S = OperationStatus


log = logging.getLogger(__name__)


_SQL = queries("lock_pair", slots=SLOTS)


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
    (lock_pair_txn), then runs the acceptance's writer and the claim's writer; a stop
    or pause found under the task's lock, a report the one statement does not cover, or a
    claim it does not cover rolls the whole transaction back and runs the two apart.

    Preconditions: ``lease`` is this worker's claim and ``report`` what its call returned; no
    transaction is open; ``next_id`` is a worker's call of a tool class without a concurrency
    limit (what a drainer's list of calls run alone holds: runtime.drainers).
    """
    actor = execution_actor(execution_id)
    op = lease.operation
    if fast_acceptable(op, lease.lease_generation, lease.state_version):
        try:
            return contention_retry(
                lambda: _report_and_claim(lease, report, next_id, execution_id, actor)
            )
        except (_Apart, StoppedUnderLock, PausedUnderLock):
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
        lock_pair_txn([lease.operation.pk, next_id])
        accepted = accept_fast_txn(
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


def lock_pair_txn(operation_ids: list[str]) -> None:
    """Lock ``operation_ids`` and their tasks in the global order (operations in ascending id,
    then tasks in ascending id), inside the caller's transaction: what a transaction that runs
    two writers over different operations takes first, so neither writer locks out of order
    (two drainers handing over across two tasks in opposite directions would deadlock)."""
    with prepared_cursor() as cur:
        cur.execute(_SQL["lock_pair"], {"ids": operation_ids})  # type: ignore[arg-type]
        cur.fetchall()
