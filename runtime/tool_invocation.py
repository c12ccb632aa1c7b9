"""One call of a claimed operation's tool: the adapter at the operation's tool version, given the
operation's stable key and the lease generation as fencing token, its outcome turned into the
report the acceptance takes (runtime.executor runs it for deliveries, drainers and slots)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.db import outside_transaction
from runtime.errors import StaleLease
from runtime.models import Operation
from runtime.slots import awaited, db_step
from runtime.tools import Contract, InvocationContext, ToolFailure, ToolResult, adapter_at
from runtime.transitions.accept_decision import Report
from runtime.transitions.lease import Lease, lease_heartbeat

log = logging.getLogger(__name__)


def tool_invoke(op: Operation, lease: Lease) -> Report:
    """Make the claimed call of ``op`` under ``lease``, its outcome as a report (a failure the
    tool did not classify is ``unknown``, never a guessed failure). Preconditions: no transaction
    open; the caller binds the log context (runtime.logcontext)."""
    # The tool as recorded: a declared tool's version of the operation (the claim checked it).
    adapter = adapter_at(op.tool, op.tool_version)

    def heartbeat() -> bool:
        try:
            # In a slot, from any thread: a pooled connection, held only for the statement.
            with db_step():
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
            found = awaited(adapter.lookup(ctx))
            if found is not None:
                return _succeeded(found)
        outcome = awaited(adapter.invoke(ctx))
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
        tool_version=op.tool_version,
    )
