"""Dispatch: due notifications become messages, one per recipient, kind and channel at most every
NOTIFY_DIGEST_SECONDS (a digest gathers the rest); a message is an operation of the day's
system notification task, proposed under ``key_notice``, so the worker runs it like any
effect."""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.actors import SYSTEM
from runtime.keys import key_notice
from runtime.models import (
    Approval,
    Notification,
    NotificationPreference,
    NotificationStream,
    NotificationTask,
)
from runtime.models.notifications import Channel, NotificationKind
from runtime.notifications.fanout import fan_out
from runtime.notifications.people import email_address
from runtime.specs import OperationSpec
from runtime.tasks import TaskSpec, task_create
from runtime.transitions.propose import operation_propose_txn

log = logging.getLogger(__name__)


K = NotificationKind


# What each kind says, in a line (the subject of a single message).
_TITLES = {
    K.APPROVAL_REQUESTED: "Approval needed",
    K.APPROVAL_EXPIRING: "Approval about to expire",
    K.WAIT_EXPIRING: "Wait about to expire",
    K.OPERATION_UNRESOLVED: "Unresolved operation",
    K.TASK_FAILED: "Task failed",
}


_TOOLS = {
    Channel.EMAIL: "notify.email",
    Channel.WEBHOOK: "notify.webhook",
    Channel.SLACK: "notify.slack",
}


# Notifications one message carries at most (a digest); the rest go in the next.
_DIGEST_MAX = 50


def notification_task_id(now: datetime) -> str:
    """The system task holding ``now``'s UTC day of notification operations, created once
    (``NotificationTask.day`` is unique: a racing creator's task rolls back with its row).
    Preconditions: no transaction open (it may commit one of its own)."""
    day = now.astimezone(ZoneInfo("UTC")).date()
    found = NotificationTask.objects.filter(day=day).values_list("task_id", flat=True).first()
    if found:
        return str(found)
    try:
        with transaction.atomic():
            task = task_create(SYSTEM, _day_spec(day))
            NotificationTask.objects.create(day=day, task=task)
    except IntegrityError:
        pass
    return str(NotificationTask.objects.filter(day=day).values_list("task_id", flat=True).get())


def _day_spec(day: date) -> TaskSpec:
    return TaskSpec(
        name=f"notifications {day.isoformat()}",
        input={"system": "notifications", "day": day.isoformat()},
    )


def dispatch_due(now: datetime | None = None, batch: int = 200) -> int:
    """Hand due notifications to messages (operations); returns how many messages were
    proposed. Preconditions: no transaction open."""
    now = now or timezone.now()
    groups = list(
        Notification.objects.filter(operation__isnull=True, due_at__lte=now)
        .values_list("recipient", "channel", "kind")
        .distinct()[:batch]
    )
    if not groups:
        return 0
    task_id = notification_task_id(now)
    sent = 0
    for recipient, channel, kind in groups:
        try:
            sent += _dispatch_stream(recipient, channel, kind, task_id=task_id, now=now)
        except Exception:
            # One recipient's trouble (an address gone, a refused proposal) holds up no other.
            log.exception(
                "dispatching %s %s %s failed; retried next sweep", recipient, kind, channel
            )
    return sent


def _dispatch_stream(
    recipient: str, channel: str, kind: str, *, task_id: str, now: datetime
) -> int:
    NotificationStream.objects.bulk_create(
        [NotificationStream(recipient=recipient, channel=channel, kind=kind)],
        ignore_conflicts=True,
    )
    with transaction.atomic():
        # The stream row first: two dispatchers of one recipient's kind take turns here, so
        # the once-a-window rule is exact.
        stream = NotificationStream.objects.select_for_update().get(
            recipient=recipient, channel=channel, kind=kind
        )
        window = timedelta(seconds=settings.NOTIFY_DIGEST_SECONDS)
        waiting = Notification.objects.filter(
            recipient=recipient, channel=channel, kind=kind, operation__isnull=True
        )
        if stream.last_sent_at is not None and stream.last_sent_at + window > now:
            # Sent less than a window ago: these wait for the next message (the digest).
            waiting.filter(due_at__lt=stream.last_sent_at + window).update(
                due_at=stream.last_sent_at + window
            )
            return 0
        items = list(
            waiting.filter(due_at__lte=now)
            .select_related("event")
            .order_by("created_at", "id")[:_DIGEST_MAX]
        )
        if not items:
            return 0
        spec = _message_spec(items, recipient=recipient, channel=channel, kind=kind)
        if spec is None:
            # Nowhere to send it any more (the person's address or the endpoint is gone).
            Notification.objects.filter(pk__in=[n.pk for n in items]).update(
                held="no_channel", due_at=now + timedelta(days=3650)
            )
            return 0
        op, _ = operation_propose_txn(SYSTEM, task_id, spec)
        Notification.objects.filter(pk__in=[n.pk for n in items]).update(
            operation=op, sent_at=now, held=""
        )
        stream.last_sent_at = now
        stream.save(update_fields=["last_sent_at"])
    return 1


def approval_link(approval: Approval) -> str:
    """The exact request on /approvals/ (its id and parameter hash), never a decision: the
    decision is taken there, bound to that hash and rechecked at release."""
    query = urlencode(
        {"task": approval.task_id, "approval": approval.pk, "params_hash": approval.params_hash},
        safe=":",  # the hash as people read it (a query may hold ':')
    )
    return f"{settings.CONSOLE_URL}/approvals/?{query}#title-{approval.pk}"


def _item(notification: Notification) -> dict[str, Any]:
    event = notification.event
    base = settings.CONSOLE_URL
    item: dict[str, Any] = {
        "event": event.pk,
        "kind": event.kind,
        "at": event.created_at.isoformat(),
        "task": event.task_id,
    }
    what = ""
    if event.approval_id:
        approval = Approval.objects.filter(pk=event.approval_id).first()
        if approval is not None:
            item.update(
                approval=approval.pk,
                params_hash=approval.params_hash,
                operation=approval.operation_id,
                link=approval_link(approval),
                expires_at=approval.expires_at.isoformat(),
            )
            what = f"{approval.tool} ({approval.pk}, parameters {approval.params_hash[:19]}…)"
    elif event.operation_id:
        item.update(operation=event.operation_id, link=f"{base}/operations/{event.operation_id}/")
        what = f"{event.data.get('tool', 'operation')} ({event.operation_id})"
    elif event.task_id:
        item["link"] = f"{base}/tasks/{event.task_id}/"
        what = f"task {event.task_id}" + (
            f": {event.data['reason']}" if event.data.get("reason") else ""
        )
    item["text"] = f"{_TITLES.get(event.kind, event.kind)}: {what}".strip()
    return item


def _message_spec(
    items: list[Notification], *, recipient: str, channel: str, kind: str
) -> OperationSpec | None:
    entries = [_item(n) for n in items]
    digest = len(entries) > 1
    title = _TITLES.get(kind, kind)
    subject = f"[agent console] {title}" + (
        f" ({len(entries)})" if digest else f": {entries[0]['text'].split(': ', 1)[-1]}"
    )
    lines = [f"- {e['text']}\n  {e.get('link', '')}" for e in entries]
    text = (
        (
            f"{len(entries)} notifications of this kind, gathered in one message:\n\n"
            if digest
            else ""
        )
        + "\n".join(lines)
        + "\n\nDecide in the console: this message approves nothing by itself."
    )
    first = items[0]
    key = key_notice(f"digest-{first.pk}" if digest else first.event_id, recipient, channel)
    _kind_of, _, target = recipient.partition(":")
    if channel == Channel.EMAIL:
        user = get_user_model().objects.filter(pk=int(target), is_active=True).first()
        pref = NotificationPreference.objects.filter(user_id=int(target)).first()
        address = email_address(user, pref) if user is not None else ""
        if not address:
            return None
        params: dict[str, Any] = {
            "to": [address],
            "subject": subject[:300],
            "body": text,
            "kind": kind,
            "notifications": [n.pk for n in items],
        }
    elif channel == Channel.WEBHOOK:
        params = {
            "endpoint": target,
            "payload": {
                "kind": kind,
                "digest": digest,
                "text": subject,
                "items": entries,
            },
        }
    else:
        params = {"endpoint": target, "text": f"*{subject}*\n" + "\n".join(lines)}
    return OperationSpec(
        tool=_TOOLS[channel],
        params=params,
        step=f"notify.{kind}",
        idempotency_key=key,
        key_derived=True,
    )


def notify_dispatch(now: datetime | None = None) -> dict[str, int]:
    """Fan out what was triggered, then send what is due (the worker's hint and the sweep)."""
    now = now or timezone.now()
    return {"notifications_fanned_out": fan_out(now), "notifications_sent": dispatch_due(now)}
