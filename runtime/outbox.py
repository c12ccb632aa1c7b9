"""Transactional outbox: work is announced by a row written with the state change that made it due;
the relay publishes committed rows to Celery after commit, and the sweeper publishes again any row
that no claim consumed in time. Losing Redis loses no work; duplicates are dropped by the claim."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime.admission import tool_class_of
from runtime.drainers import queues_waiting
from runtime.logcontext import REQUEST_ID, request_id_current
from runtime.models import Operation, OutboxMessage
from runtime.publish import EXECUTE_OPERATION, publish
from runtime.tracing import carrier, continued, has_current, tracing_enabled

log = logging.getLogger(__name__)

TOPIC_EXECUTE = "operation.execute"
# Due within this many seconds: published at once with a countdown; later ones wait for the
# sweeper, so no message sits in the broker long enough to meet its visibility timeout.
_COUNTDOWN_LIMIT = 60.0


# An announcement's payload when neither a trace nor a request is bound (one object, not one
# per statement).
_NO_PAYLOAD = Jsonb({})


def outbox_payload_dict() -> dict[str, str]:
    """What an outbox row written now carries beside its operation: the trace context the work
    continues (runtime.tracing; empty while tracing is off) and the id of the request that
    caused it (runtime.logcontext), so that a message the sweeper publishes again carries both
    as the first did."""
    payload = carrier()
    request_id = request_id_current()
    if request_id:
        payload[REQUEST_ID] = request_id
    return payload


def outbox_payload() -> Jsonb:
    """``outbox_payload_dict`` as a one-statement form binds it (``outbox_announce``)."""
    payload = outbox_payload_dict()
    return Jsonb(payload) if payload else _NO_PAYLOAD


def outbox_enqueue_txn(
    *, topic: str, operation_id: str, now: datetime, available_at: datetime | None = None
) -> OutboxMessage:
    """Write an outbox row in the caller's transaction and publish it once that commits; the
    row keeps the current trace context and request id, as ``outbox_payload`` does."""
    message = OutboxMessage.objects.create(
        topic=topic,
        operation_id=operation_id,
        payload=outbox_payload_dict(),
        created_at=now,
        available_at=available_at or now,
    )
    transaction.on_commit(lambda: outbox_publish([message]))
    return message


def outbox_traces(operation_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The trace context each operation's latest announcement kept (its ``payload``), for work
    taken without a message that carried it (a drainer's, a call made in process): one read,
    made only while tracing is on (runtime.executor), before the claim spends the rows."""
    if not tracing_enabled() or not operation_ids:
        return {}
    rows = OutboxMessage.objects.filter(operation_id__in=operation_ids).order_by("pk")
    return {op: payload for op, payload in rows.values_list("operation_id", "payload") if payload}


def outbox_continued(operation_id: str) -> AbstractContextManager[None]:
    """The trace a delivery continues: its message's (Celery's instrumentation made it current
    from the headers), else the one its announcement kept. Nothing is read while off."""
    if has_current():
        return nullcontext()
    return continued(outbox_traces([operation_id]).get(operation_id))  # type: ignore[no-any-return]


def outbox_consume_txn(operation_id: str) -> None:
    """The claim took the work: its announcements (and any republished copies) are spent."""
    OutboxMessage.objects.filter(operation_id=operation_id).delete()


def queues_for(operation_ids: list[str]) -> dict[str, str]:
    """The Celery queue of each operation whose tool class has one of its own (TOOL_QUEUES);
    the rest go to the default queue. One query, and none when no class has a queue."""
    if not settings.TOOL_QUEUES or not operation_ids:
        return {}
    tools = Operation.objects.filter(pk__in=operation_ids).values_list("pk", "tool")
    routed = {pk: settings.TOOL_QUEUES.get(tool_class_of(tool)) for pk, tool in tools}
    return {pk: queue for pk, queue in routed.items() if queue}


def outbox_publish(messages: list[OutboxMessage], queues: dict[str, str] | None = None) -> int:
    """Hand committed rows to the broker. A failure leaves the row for the sweeper. ``queues``:
    each message's operation's queue, from a caller that knows their tools (the hot path's, so
    that its pinned statements stay its own); otherwise read (``queues_for``)."""
    sent = 0
    now = timezone.now()
    routes = (
        queues_for([m.operation_id for m in messages if m.operation_id])
        if queues is None
        else queues
    )
    for message in messages:
        delay = (message.available_at - now).total_seconds()
        if delay > _COUNTDOWN_LIMIT:
            continue
        # None: the default queue (task_default_queue).
        queue: Any = routes.get(message.operation_id or "")
        try:
            # Sent in the trace the row kept (Celery's instrumentation puts it into the
            # message's headers), also when the sweeper sends a lost message again, and with
            # the id of the request that caused the work.
            with continued(message.payload if tracing_enabled() else None):
                publish(
                    EXECUTE_OPERATION,
                    message.operation_id,
                    message.pk,
                    countdown=max(0.0, delay),
                    queue=queue,
                    request_id=(message.payload or {}).get(REQUEST_ID),
                )
            sent += 1
        except Exception:
            log.warning(
                "outbox %s not published; the sweeper will retry", message.pk, exc_info=True
            )
    return sent


# A row republished n times waits grace * 2^n before the next republish (capped), so a sweep
# under backlog, whose messages are still queued in the broker, does not flood it with copies
# faster than workers drain them (no feedback loop).
_REPUBLISH_BACKOFF_CAP = 6


# When this process's sweeps last saw each queue hold nothing (runtime.outbox.queues_drained_at).
_drained_at: dict[str, datetime] = {}


def queues_drained_at(now: datetime) -> dict[str, datetime] | None:
    """For each queue of this deployment, the last time a sweep here saw it hold no message
    (``now`` when it holds none now); a queue never seen empty is absent. None when the broker
    cannot say (the embedded broker; Redis unreachable)."""
    if settings.EMBEDDED_BROKER:
        return None
    try:
        waiting = queues_waiting(list(settings.CELERY_QUEUES))
    except Exception:
        log.warning("the broker's queues are unreadable; stale announcements count as lost")
        return None
    for queue, count in waiting.items():
        if count == 0:
            _drained_at[queue] = now
    return {q: _drained_at[q] for q in settings.CELERY_QUEUES if q in _drained_at}


def _lost(stale: list[OutboxMessage], drained: dict[str, datetime] | None) -> list[OutboxMessage]:
    """The stale rows whose message cannot still be waiting in the broker: published before
    their queue was last seen empty. A row published since then may be queued behind a
    backlog, and a copy of it would only be one more delivery to refuse."""
    if drained is None:
        return stale
    routes = queues_for([m.operation_id for m in stale if m.operation_id])
    lost = []
    for message in stale:
        queue = routes.get(message.operation_id or "") or settings.CELERY_QUEUE
        seen_empty = drained.get(queue)
        if seen_empty is not None and message.published_at <= seen_empty:  # type: ignore[attr-defined]
            lost.append(message)
    return lost


def outbox_sweep(now: datetime | None = None, batch: int = 500) -> int:
    """Publish again the rows due for longer than the grace period, still unconsumed and lost:
    published before their queue was last seen empty in the broker (a backlog's rows wait in
    it, and are not copied), each one later than the last time (exponential backoff per row).
    Where the broker cannot say (embedded; Redis down) every stale row counts as lost."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.OUTBOX_GRACE_SECONDS)
    drained = queues_drained_at(now)
    if drained is not None and not drained:
        return 0  # no queue was ever seen empty: every announcement may still be queued
    with transaction.atomic():
        qs = OutboxMessage.objects.filter(available_at__lte=now - grace).annotate(
            published_at=Coalesce("last_published_at", "created_at")
        )
        if drained is not None:
            qs = qs.filter(published_at__lte=max(drained.values()))
        qs = qs.order_by("available_at")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True, of=("self",))
        stale = _lost(list(qs[:batch]), drained)
        if not stale:
            return 0
        for message in stale:
            backoff = 2 ** min(message.publish_count + 1, _REPUBLISH_BACKOFF_CAP)
            OutboxMessage.objects.filter(pk=message.pk).update(
                available_at=now + grace * (backoff - 1),
                publish_count=F("publish_count") + 1,
                last_published_at=now,
            )
    for message in stale:
        message.available_at = timezone.now()  # due now: publish without a countdown
    return outbox_publish(stale)
