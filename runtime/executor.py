"""The worker's side of the path: claim under a new lease generation, run the tool adapter with
the operation's stable key and the generation as fencing token, report the result for fenced
acceptance. Duplicate or late deliveries find nothing to claim and do nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.db import contention_retry, outside_transaction
from runtime.errors import StaleLease
from runtime.executions import execution_current
from runtime.leases import Lease, Refusal, claim_refused_record, lease_heartbeat, operation_claim
from runtime.models import Operation
from runtime.operations import Report, operation_report
from runtime.stopping import CancelWatch
from runtime.tools import Contract, InvocationContext, ToolFailure, ToolResult, adapter_for

log = logging.getLogger(__name__)


def operation_execute(operation_id: str) -> str:
    """Run one delivery of an operation; returns what happened, for logs and tests."""
    execution_id = execution_current()
    lease = contention_retry(lambda: operation_claim(operation_id, execution_id=execution_id))
    if isinstance(lease, Refusal):
        if lease.operation_exists:
            claim_refused_record(operation_id, execution_id, lease.reason)
        return "nothing_to_claim"
    # Limits: a call that ignores a cancel past the grace period is ended by this worker.
    with CancelWatch(
        operation_id=operation_id,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
    ):
        report = _invoke(lease.operation, lease)
    try:
        contention_retry(
            lambda: operation_report(
                operation_id,
                lease_generation=lease.lease_generation,
                lease_token=lease.lease_token,
                state_version=lease.state_version,
                report=report,
                snapshot=lease.operation,
                execution_id=execution_id,
            )
        )
    except StaleLease:
        log.info(
            "late result for %s under generation %s rejected", operation_id, lease.lease_generation
        )
        return "rejected"
    return report.outcome


def _invoke(op: Operation, lease: Lease) -> Report:
    """Run the adapter outside any transaction: the receiver's commit is its own."""
    adapter = adapter_for(op.tool)

    def heartbeat() -> bool:
        try:
            _, cancel = lease_heartbeat(op.pk, lease.lease_generation, lease.lease_token)
        except StaleLease:
            return True  # lost the lease: stop as if cancelled
        return cancel

    ctx = invocation_context(
        op,
        fencing_token=lease.lease_generation,
        invocation_number=lease.invocation_number,
        heartbeat=heartbeat,
    )
    outside_transaction("invoking a tool")
    try:
        if adapter.contract == Contract.LOOKUP and lease.invocation_number > 1:
            # An earlier invocation went unconfirmed: ask the receiver before acting again.
            found = adapter.lookup(ctx)
            if found is not None:
                return _succeeded(found)
        outcome = adapter.invoke(ctx)
    except ToolFailure as failure:
        if failure.kind == ToolFailure.UNKNOWN:
            return Report(outcome="unknown", message=failure.message, receipt=failure.receipt)
        return Report(
            outcome="failed",
            error_kind=failure.kind,
            message=failure.message,
            receipt=failure.receipt,
        )
    except Exception as exc:
        # An unexpected exception may have struck after the receiver acted: the honest outcome
        # is unknown, and recovery follows the receiver's contract (never a guessed failure).
        log.exception("tool %s raised", op.tool)
        return Report(outcome="unknown", message=f"the tool raised {exc!r}"[:500])
    return _succeeded(outcome)


def _succeeded(outcome: ToolResult) -> Report:
    return Report(
        outcome="succeeded",
        result=outcome.result,
        usage=outcome.usage,
        receipt=outcome.receipt,
        provider_handle=outcome.provider_handle,
    )


def invocation_context(
    op: Operation,
    *,
    fencing_token: int,
    invocation_number: int,
    heartbeat: Callable[[], bool] = lambda: False,
) -> InvocationContext:
    """What an adapter gets for one call: the operation's stable key and parameters, and the
    lease generation as fencing token."""
    return InvocationContext(
        operation_id=op.pk,
        task_id=op.task_id,
        step=op.step,
        idempotency_key=op.idempotency_key,
        params=op.params,
        fencing_token=fencing_token,
        invocation_number=invocation_number,
        deadline=op.deadline,
        heartbeat=heartbeat,
    )
