"""The record of what a stale or duplicate actor tried (a report under a lost lease, a refused
claim, a heartbeat of an old generation): kept for diagnosis after the refused change rolled
back, in a transaction of its own."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from runtime.actors import execution_actor
from runtime.events import event_append_txn
from runtime.models import Operation, RejectedObservation


def rejection_record(
    *,
    operation_id: str | None,
    kind: str,
    lease_generation: int | None = None,
    state_version: int | None = None,
    execution_id: str | None = None,
    actor: str = "",
    detail: dict[str, Any] | None = None,
) -> RejectedObservation:
    """Keep what a stale or duplicate actor tried, for diagnosis, after the rejected change
    rolled back (its own atomic block). A stale completion is also journalled, so live pages
    show it; routine duplicate deliveries are only kept, not journalled."""

    with transaction.atomic():
        rejected = RejectedObservation.objects.create(
            operation_id=operation_id,
            kind=kind,
            lease_generation=lease_generation,
            state_version=state_version,
            execution_id=execution_id,
            detail=detail or {},
        )
        if kind == "stale_completion" and operation_id is not None:
            op = Operation.objects.filter(pk=operation_id).only("task_id", "state_version").first()
            if op is not None:
                event_append_txn(
                    task_id=op.task_id,
                    type="operation.report_rejected",
                    state_version=op.state_version,
                    now=timezone.now(),
                    operation_id=operation_id,
                    actor=actor or execution_actor(execution_id),
                    data={"lease_generation": lease_generation, "reason": "stale report refused"},
                )
    return rejected
