"""Admission control: eligibility is not capacity. Per tool class, at most N operations run at
once (a concurrency slot, checked at every claim, a worker's or an agent's: running work is active
work whoever runs it) and at most M wait admitted (queue capacity, checked at proposal: beyond it
429 ``queue_full`` with Retry-After and nothing written).

Waiting work is everything admitted and not yet running: pending, retry_scheduled, and work
waiting for a person's approval. Gated work counts from its proposal, so an approval moves it
within the queue and never adds to it (a class whose queue is full gets no more waiting work
through approvals); an approved action whose slots are taken waits ``pending``, claimable later.

Both counts are made under the class's ToolSlot row lock, so two claims (or two proposals) of a
class can never both see the last free place. Classes without a configured limit take no lock and
run no statement. Lock order: the slot row comes first, before operation and task rows.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Q

from runtime.crashpoints import crash_point
from runtime.errors import QueueFull
from runtime.models import Operation, ToolSlot
from runtime.rules.statuses import OperationStatus
from runtime.tools import adapters

S = OperationStatus
# Admitted and not yet running: what queue capacity bounds.
WAITING = (S.PENDING, S.RETRY_SCHEDULED, S.WAITING_APPROVAL)


def tool_class_of(tool: str) -> str:
    adapter = adapters().get(tool)
    return (adapter.tool_class if adapter is not None else "") or tool


def _class_filter(tool_class: str) -> Q:
    tools = [name for name, a in adapters().items() if (a.tool_class or name) == tool_class]
    return Q(tool__in=tools or [tool_class])


def _slot_lock_txn(tool_class: str) -> None:
    ToolSlot.objects.get_or_create(tool_class=tool_class)
    ToolSlot.objects.select_for_update().filter(tool_class=tool_class).first()


def queue_limited(tool: str) -> bool:
    """Whether proposals of this tool's class are counted against a queue capacity (and so
    need a transaction around the count and the insert)."""
    return tool_class_of(tool) in settings.TOOL_QUEUE_CAPACITY


def queue_admit_txn(tool: str) -> None:
    """Refuse a proposal (or a renewal that makes expired gated work wait again) when its tool
    class already has M admitted and waiting operations. First statement of the caller's
    transaction (slot before operation and task rows)."""
    tool_class = tool_class_of(tool)
    capacity = settings.TOOL_QUEUE_CAPACITY.get(tool_class)
    if capacity is None:
        return
    _slot_lock_txn(tool_class)
    waiting = Operation.objects.filter(_class_filter(tool_class), status__in=WAITING).count()
    crash_point("admission.counted")
    if waiting >= capacity:
        slots = max(1, settings.TOOL_CONCURRENCY.get(tool_class, 1))
        raise QueueFull(
            f"tool class {tool_class} has {waiting} operations waiting (capacity {capacity})",
            retry_after=max(1, waiting // slots),
            tool_class=tool_class,
        )


def concurrency_slot_free_txn(tool: str) -> bool:
    """Whether a claim of this tool may start now: fewer than N of its class running. Holds the
    class's slot lock to the end of the claim's transaction, so the count stays true until the
    claim's own row is running."""
    tool_class = tool_class_of(tool)
    slots = settings.TOOL_CONCURRENCY.get(tool_class)
    if slots is None:
        return True
    _slot_lock_txn(tool_class)
    running = Operation.objects.filter(_class_filter(tool_class), status=S.RUNNING).count()
    crash_point("claim.slot_counted")
    return running < slots
