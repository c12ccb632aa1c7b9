"""What a person's resolution writes beside the operation's status (runtime.resolutions): the
audit row, the lookup's own invocation; and the check that a retry may enter its task."""

from __future__ import annotations

from typing import Any

from django.db.models import Max

from runtime.actors import Actor
from runtime.errors import TaskRefused
from runtime.models import Invocation, Operation, Resolution, Task
from runtime.stoprule import task_stopping


def retry_admitted(task: Task) -> None:
    """Nothing is re-admitted for a stopping task except its compensations. ``task`` was read
    under its row lock."""
    if task_stopping(task):
        raise TaskRefused(
            "the task has stopped: its work is not retried",
            code="task_cancelled" if task.cancellation != "none" else "task_terminal",
        )


def lookup_invocation_txn(op: Operation, looked_up: Any, now: Any) -> None:
    """The person's lookup is an invocation of its own: asked, answered, with its receipt."""
    number = (op.invocations.aggregate(n=Max("number"))["n"] or 0) + 1
    if looked_up:
        outcome, receipt = Invocation.OUTCOME_SUCCEEDED, looked_up.receipt
    else:
        outcome, receipt = "no_record", {"via": "lookup", "found": False}
    Invocation.objects.create(
        operation=op,
        number=number,
        lease_generation=op.lease_generation,
        started_at=now,
        finished_at=now,
        outcome=outcome,
        receipt=receipt,
        provider_handle=getattr(looked_up, "provider_handle", "") or "",
    )


def audit_txn(
    op: Operation,
    actor: Actor,
    resolution: str,
    evidence: str,
    from_status: str,
    to_status: str,
    now: Any,
) -> None:
    """The audit row of a resolution: who, what, on what evidence, from which status to which."""
    Resolution.objects.create(
        operation=op,
        actor=actor.label,
        resolution=resolution,
        evidence=evidence,
        from_status=from_status,
        to_status=to_status,
        state_version=op.state_version,
        at=now,
    )
