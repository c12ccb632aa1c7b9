"""Fan-out: one ``Notification`` per recipient and channel for an event not yet fanned out,
to the people whose role can act on it now and the task's watchers (on the channels they
chose, due at once or when their quiet hours end), and to every configured webhook."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from runtime.actors import Actor, actor_for_user
from runtime.models import (
    Approval,
    Notification,
    NotificationEvent,
    NotificationPreference,
    Operation,
    Task,
    TaskWatch,
)
from runtime.models.notifications import Channel, NotificationKind
from runtime.notifications.people import email_address, quiet_until
from runtime.notify_secrets import endpoints
from runtime.policy import (
    allowed,
    approval_decision_refusal,
    can_follow_task,
    can_manage_waits,
    can_resolve,
    can_start_attempt,
    can_use_console,
)
from runtime.rules.statuses import ApprovalStatus, OperationStatus

K = NotificationKind


@dataclass(frozen=True)
class _Person:
    user_id: int
    reason: str


def _console_people() -> list[tuple[Any, Actor]]:
    users = get_user_model().objects.filter(is_active=True).order_by("pk")
    people = []
    for user in users:
        actor = actor_for_user(int(user.pk), user.get_username())
        if allowed(can_use_console, actor):
            people.append((user, actor))
    return people


def _who_can_act(event: NotificationEvent, task: Task | None) -> list[_Person]:
    """The people whose role can act on ``event`` now (rights read from runtime.policy)."""
    found: list[_Person] = []
    approval = Approval.objects.filter(pk=event.approval_id).first() if event.approval_id else None
    for user, actor in _console_people():
        reason = ""
        if event.kind in (K.APPROVAL_REQUESTED, K.APPROVAL_EXPIRING):
            if approval is not None and approval_decision_refusal(actor, approval) is None:
                reason = approval.approver_role
        elif event.kind == K.OPERATION_UNRESOLVED:
            reason = "support" if allowed(can_resolve, actor) else ""
        elif event.kind == K.WAIT_EXPIRING:
            reason = "admin" if allowed(can_manage_waits, actor) else ""
        elif event.kind == K.TASK_FAILED and task is not None:
            reason = "admin" if allowed(can_start_attempt, actor, task) else ""
        if reason:
            found.append(_Person(int(user.pk), reason))
    if task is not None:
        acting = {p.user_id for p in found}
        for watch in TaskWatch.objects.filter(task=task).select_related("user"):
            user = watch.user
            if user.pk in acting or not user.is_active:
                continue
            actor = actor_for_user(int(user.pk), user.get_username())
            if allowed(can_follow_task, actor, task):
                found.append(_Person(int(user.pk), "watcher"))
    return found


def _still_actionable(event: NotificationEvent) -> bool:
    """An approval decided (or an operation resolved) before the fan-out needs nobody."""
    if event.kind in (K.APPROVAL_REQUESTED, K.APPROVAL_EXPIRING):
        return Approval.objects.filter(pk=event.approval_id, status=ApprovalStatus.PENDING).exists()
    if event.kind == K.OPERATION_UNRESOLVED:
        return Operation.objects.filter(
            pk=event.operation_id, status=OperationStatus.UNRESOLVED
        ).exists()
    if event.kind == K.WAIT_EXPIRING:
        return Operation.objects.filter(
            pk=event.operation_id, status=OperationStatus.WAITING
        ).exists()
    return True


def fan_out(now: datetime | None = None, batch: int = 100) -> int:
    """Write the notifications of events not yet fanned out; returns how many events were.
    Each event in its own transaction, locked with SKIP LOCKED (two fan-outs never take the
    same one; ``notification_once`` keeps a recipient's notification single anyway).
    Preconditions: no transaction open."""
    now = now or timezone.now()
    done = 0
    ids = list(
        NotificationEvent.objects.filter(fanned_out_at__isnull=True)
        .order_by("created_at")
        .values_list("pk", flat=True)[:batch]
    )
    for event_id in ids:
        with transaction.atomic():
            qs = NotificationEvent.objects.filter(pk=event_id, fanned_out_at__isnull=True)
            if connection.features.has_select_for_update_skip_locked:
                qs = qs.select_for_update(skip_locked=True)
            event = qs.first()
            if event is None:
                continue
            Notification.objects.bulk_create(_notifications_for(event, now), ignore_conflicts=True)
            NotificationEvent.objects.filter(pk=event.pk).update(fanned_out_at=now)
            done += 1
    return done


def _notifications_for(event: NotificationEvent, now: datetime) -> list[Notification]:
    if not _still_actionable(event):
        return []
    task = Task.objects.filter(pk=event.task_id).first() if event.task_id else None
    rows: list[Notification] = []
    people = _who_can_act(event, task)
    prefs = {
        p.user_id: p
        for p in NotificationPreference.objects.filter(user_id__in=[x.user_id for x in people])
    }
    users = {u.pk: u for u in get_user_model().objects.filter(pk__in=[x.user_id for x in people])}
    for person in people:
        pref = prefs.get(person.user_id)
        if not email_address(users[person.user_id], pref):
            continue  # no channel chosen: the console's own pages still show the work
        quiet = quiet_until(pref, now)
        rows.append(
            Notification(
                event=event,
                kind=event.kind,
                recipient=f"user:{person.user_id}",
                user_id=person.user_id,
                channel=Channel.EMAIL,
                reason=person.reason,
                due_at=quiet or now,
                held="quiet_hours" if quiet else "",
                created_at=now,
            )
        )
    for endpoint in endpoints():
        if endpoint.kinds and event.kind not in endpoint.kinds:
            continue
        rows.append(
            Notification(
                event=event,
                kind=event.kind,
                recipient=f"endpoint:{endpoint.id}",
                channel=endpoint.format,
                reason="endpoint",
                due_at=now,
                created_at=now,
            )
        )
    return rows
