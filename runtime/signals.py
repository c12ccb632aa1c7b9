"""Signals: external events addressed to a task, each given one disposition on arrival and kept.

- ``delivered``: a waiting signal wait of that name took it (its payload is the wait's result);
- ``buffered``: the task exists but nothing waits for it yet; the next matching wait consumes it;
- ``duplicate``: the ``event_id`` was seen before (the answer names the original disposition);
- ``late``: the matching wait already expired (or the task ended): recorded, not applied.

The unique (task, event_id) constraint is what makes a repeat a duplicate, even for two copies
arriving at once. Registration races are closed by the task row lock (see ``runtime.waits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.crashpoints import crash_point
from runtime.errors import InvalidInput
from runtime.events import event_append_txn
from runtime.models import Operation, Signal
from runtime.policy import can_signal
from runtime.rules.statuses import OperationStatus
from runtime.selectors.tasks import task_get
from runtime.stoprule import stopping
from runtime.transitions.propose_wait import wait_satisfy_txn

S = OperationStatus


@dataclass(frozen=True)
class SignalAnswer:
    disposition: str
    signal: Signal
    original: str | None = None  # for a duplicate: the disposition the first copy got


def _waiting(task_id: str, name: str) -> Operation | None:
    # SKIP LOCKED: a wait that the sweeper is expiring right now is not waited for (the signal
    # is then buffered or late, which is what it would be a moment later anyway).
    return (
        Operation.objects.select_for_update(skip_locked=True)
        .filter(task_id=task_id, kind=Operation.KIND_WAIT_SIGNAL, signal=name, status=S.WAITING)
        .order_by("created_at", "id")
        .first()
    )


def _expired(task_id: str, name: str) -> Operation | None:
    # SKIP LOCKED: one that someone is renewing or cancelling right now is left unlinked.
    return (
        Operation.objects.select_for_update(skip_locked=True)
        .filter(task_id=task_id, kind=Operation.KIND_WAIT_SIGNAL, signal=name, status=S.EXPIRED)
        .order_by("-updated_at")
        .first()
    )


def signal_send(
    actor: Actor, task_id: str, *, event_id: str, name: str, payload: dict[str, Any]
) -> SignalAnswer:
    """Record a signal and apply it. Preconditions: ``actor`` may see the task (else NotFound)."""
    task = task_get(actor, task_id)
    can_signal(actor, task)
    if not event_id or len(event_id) > 200:
        raise InvalidInput("event_id must have 1 to 200 characters")
    if not name or len(name) > 200:
        raise InvalidInput("name must have 1 to 200 characters")
    earlier = Signal.objects.filter(task_id=task_id, event_id=event_id).first()
    if earlier is not None:
        return SignalAnswer(Signal.DUPLICATE, earlier, earlier.disposition)
    try:
        with transaction.atomic():
            signal = _signal_apply_txn(
                actor, task_id, event_id=event_id, name=name, payload=payload
            )
    except IntegrityError:
        # A concurrent copy of the same event won the unique constraint.
        earlier = Signal.objects.filter(task_id=task_id, event_id=event_id).first()
        if earlier is None:
            raise
        return SignalAnswer(Signal.DUPLICATE, earlier, earlier.disposition)
    return SignalAnswer(signal.disposition, signal)


def _signal_apply_txn(
    actor: Actor, task_id: str, *, event_id: str, name: str, payload: dict[str, Any]
) -> Signal:
    """The signal's row, then its disposition under the task's lock: delivered to the wait
    for it, late, or buffered; both journaled."""
    now = timezone.now()
    # The event's row first: a concurrent copy of it waits here on the unique key,
    # holding nothing, instead of skipping the wait the first copy is about to take.
    signal = Signal.objects.create(
        task_id=task_id,
        event_id=event_id,
        name=name,
        payload=payload,
        disposition=Signal.BUFFERED,
        sent_by=actor.label,
        received_at=now,
    )
    wait = _waiting(task_id, name)
    # The expired wait a late signal is linked to, locked now, before the task row: the
    # link's foreign key share-locks it at commit, and a stop or a renewal holding it
    # while it waits for the task row must not wait on us in turn.
    expired = None if wait is not None else _expired(task_id, name)
    _, row = event_append_txn(
        task_id=task_id,
        type="signal.received",
        state_version=1,
        now=now,
        actor=actor.label,
        data={"signal": signal.pk, "event_id": event_id, "name": name},
    )
    crash_point("signal.task_locked")
    if wait is None:
        # A wait whose registration committed while we waited for the task lock.
        wait = _waiting(task_id, name)
    ended = stopping(row.cancellation, row.condition)
    if wait is not None and not ended:
        disposition = Signal.DELIVERED
        Signal.objects.filter(pk=signal.pk).update(
            disposition=disposition, operation=wait, consumed_at=now
        )
        wait_satisfy_txn(wait, signal, now=now, actor=actor.label)
    else:
        disposition = _undelivered_txn(signal, task_id, name, ended=ended, expired=expired)
    signal.disposition = disposition
    event_append_txn(
        task_id=task_id,
        type=f"signal.{disposition}",
        state_version=1,
        now=now,
        operation_id=wait.pk if disposition == Signal.DELIVERED and wait else None,
        actor=actor.label,
        data={"signal": signal.pk, "event_id": event_id, "name": name},
    )
    return signal


def _undelivered_txn(
    signal: Signal, task_id: str, name: str, *, ended: bool, expired: Operation | None
) -> str:
    """No wait takes it: ``late`` when the task is stopping or a wait for it expired (linked
    to that wait only when this transaction holds it), else ``buffered``."""
    late_for = (
        Operation.objects.filter(
            task_id=task_id,
            kind=Operation.KIND_WAIT_SIGNAL,
            signal=name,
            status=S.EXPIRED,
        )
        .order_by("-updated_at")
        .first()
    )
    if ended or late_for is not None:
        # Linked only to a wait this transaction holds (else left unlinked).
        held = late_for is not None and expired is not None and late_for == expired
        Signal.objects.filter(pk=signal.pk).update(
            disposition=Signal.LATE, operation=late_for if held else None
        )
        return Signal.LATE
    return Signal.BUFFERED
