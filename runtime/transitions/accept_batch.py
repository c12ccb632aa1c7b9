"""A drainer's batch acceptance (PostgreSQL): the reports of one batch claim accepted in one
transaction where the common case applies (``accept_batch_pick``, ``accept_batch_journal`` in
``runtime/sql/accept.sql``); every other report goes through ``operation_report`` on its own."""

from __future__ import annotations

import functools
import random
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime.actors import execution_actor
from runtime.crashpoints import crash_point
from runtime.db import contention_retry, fetchall_named, prepared_cursor
from runtime.drainers import queue_of
from runtime.errors import StaleLease
from runtime.logcontext import transition_fields
from runtime.models import Operation
from runtime.outbox import outbox_payload, outbox_payload_dict, outbox_publish
from runtime.rules.general_writer import ACCEPT_BATCH, general_writer_needed
from runtime.rules.statuses import OperationStatus
from runtime.rules.stop import stopping
from runtime.sqlfiles import queries
from runtime.tools import adapters
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Acceptance, Report, accept_facts, report_decision
from runtime.transitions.fast import (
    SLOTS,
    BatchStopped,
    announcement,
    hint_seq_after_commit,
    log_after_commit,
)
from runtime.transitions.lease import lease_token_digest
from runtime.transitions.status import status_deltas

S = OperationStatus

_SQL = queries("accept_batch_pick", "accept_batch_journal", slots=SLOTS)


def operations_report_batch(
    reports: list[tuple[Operation, Report]],
    *,
    lease_token: str,
    execution_id: str,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> dict[str, str]:
    """Accept the reports of one batch claim (``runtime.transitions.claim_batch``'s
    ``operations_claim_batch``), each with the claim's snapshot of its operation, in one
    transaction where the common case applies; every other report goes through
    ``operation_report`` on its own afterwards (a stale one is recorded and refused there). Returns
    each operation's outcome: the report's outcome, or ``"rejected"``.

    Preconditions: no transaction is open; every snapshot is the batch claim's (status running
    under ``lease_token``)."""
    now = now or timezone.now()
    rng = rng or random.Random()
    actor = execution_actor(execution_id)
    decided = _covered(reports, now=now, rng=rng)

    def accept() -> set[str]:
        try:
            with transaction.atomic(durable=True):
                ids = set(
                    accept_batch_txn(
                        decided,
                        lease_token_digest=lease_token_digest(lease_token),
                        actor=actor,
                        now=now,
                    )
                )
                crash_point("report.batch_before_commit")
        except BatchStopped:
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
        outcomes[op.pk] = _one_by_one(op, report, lease_token, execution_id, now=now, rng=rng)
    return outcomes


def _covered(
    reports: list[tuple[Operation, Report]], *, now: datetime, rng: random.Random
) -> list[tuple[Operation, Acceptance]]:
    """The reports' decisions, those the batch statement may write. An unresolved outcome goes
    through the one-operation path, whose writer notes it for support staff
    (runtime.notify_events), as does an ending the writer's possible-effect rule must decide
    (runtime.transitions.status.fast_ending_allowed)."""
    decided = [
        (
            op,
            report_decision(
                op, report, adapter=adapters().get(op.tool), stopping=False, now=now, rng=rng
            ),
        )
        for op, report in reports
    ]
    return [
        (op, d)
        for op, d in decided
        if general_writer_needed(ACCEPT_BATCH, accept_facts(op, d)) is None
    ]


def _one_by_one(
    op: Operation,
    report: Report,
    lease_token: str,
    execution_id: str,
    *,
    now: datetime,
    rng: random.Random,
) -> str:
    """A report the batch did not accept, on the one-operation path: its outcome, or
    ``"rejected"`` (stale: recorded and refused there)."""
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
    except StaleLease:
        return "rejected"
    return report.outcome


def accept_batch_txn(
    accepted: list[tuple[Operation, Acceptance]],
    *,
    lease_token_digest: str,
    actor: str,
    now: datetime,
) -> list[str]:
    """Accept a batch's reports, each decided from its claim's snapshot, on covered operations
    of unstopped tasks. Inside the caller's transaction; returns the ids accepted (the rest
    moved on: nothing was written for them, and the caller runs the one-operation path).
    Raises BatchStopped (the caller rolls back) when a task of the batch is stopping."""
    if not accepted:
        return []
    with prepared_cursor() as cur:
        cur.execute(_SQL["accept_batch_pick"], _pick_params(accepted, lease_token_digest, now))
        rows = fetchall_named(cur)
        if any(stopping(row["cancellation"], row["condition"]) for row in rows):
            raise BatchStopped
        done = {row["id"] for row in rows}
        batch = [(op, a) for op, a in accepted if op.pk in done]
        if not batch:
            return []
        cur.execute(_SQL["accept_batch_journal"], _journal_params(batch, actor, now))
        out = fetchall_named(cur)
    _after_commit(batch, out, now)
    log_after_commit(
        [
            transition_fields(
                f"operation.{a.edge}",
                task_id=op.task_id,
                actor=actor,
                op=op,
                data={"from": S.RUNNING, "to": a.target},
            )
            for op, a in batch
        ]
    )
    return [op.pk for op, _ in batch]


def _pick_params(
    accepted: list[tuple[Operation, Acceptance]], digest: str, now: datetime
) -> dict[str, Any]:
    """The operations' guarded UPDATE's parameters (``accept_batch_pick``), one array each."""
    return {
        "ids": [op.pk for op, _ in accepted],
        "targets": [a.target for _, a in accepted],
        "results": [None if a.result is None else Jsonb(a.result) for _, a in accepted],
        "errors": [None if a.error is None else Jsonb(a.error) for _, a in accepted],
        "next_ats": [a.next_attempt_at for _, a in accepted],
        "generations": [op.lease_generation for op, _ in accepted],
        "versions": [op.state_version for op, _ in accepted],
        "digest": digest,
        "now": now,
    }


def _journal_params(
    batch: list[tuple[Operation, Acceptance]], actor: str, now: datetime
) -> dict[str, Any]:
    """The tasks', events', invocations' and outbox rows' parameters
    (``accept_batch_journal``) of the operations the pick accepted."""
    deltas = [status_deltas(S.RUNNING, a.target) for _, a in batch]
    return {
        "ids": [op.pk for op, _ in batch],
        "tasks": [op.task_id for op, _ in batch],
        "versions": [op.state_version + 1 for op, _ in batch],
        "generations": [op.lease_generation for op, _ in batch],
        "d_actives": [d[0] for d in deltas],
        "d_claimables": [d[1] for d in deltas],
        "d_blockeds": [d[2] for d in deltas],
        "event_types": [f"operation.{a.edge}" for _, a in batch],
        "event_datas": [
            Jsonb({"from": S.RUNNING, "to": a.target, "status": a.target} | a.data)
            for _, a in batch
        ],
        "inv_outcomes": [a.invocation_outcome for _, a in batch],
        "receipts": [None if a.receipt is None else Jsonb(a.receipt) for _, a in batch],
        "handles": [a.provider_handle[:300] for _, a in batch],
        # (A batch holds worker-run calls only: a retry is announced again.)
        "announce_ats": [
            (a.next_attempt_at or now) if a.target == S.RETRY_SCHEDULED else None for _, a in batch
        ],
        "outbox_payload": outbox_payload(),
        "now": now,
        "actor": actor,
    }


def _after_commit(
    batch: list[tuple[Operation, Acceptance]], out: list[dict[str, Any]], now: datetime
) -> None:
    """The journal hints of the tasks the batch touched, and its retries' announcements, once
    the batch commits (``out``: the journal statement's rows, a task's or an outbox row's)."""
    edges = {op.task_id: f"operation.{a.edge}" for op, a in batch}
    announced = []
    trace = outbox_payload_dict()  # what the statement wrote as the rows' payload
    for row in out:
        if row["kind"] == "task":
            hint_seq_after_commit(row["key"], row["number"], edges[row["key"]])
        else:
            announced.append(
                announcement(row["number"], row["key"], row["available_at"], now, trace)
            )
    if announced:
        queues = {op.pk: queue_of(op.tool) for op, _ in batch}
        transaction.on_commit(lambda: outbox_publish(announced, queues))
