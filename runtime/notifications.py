"""Notifications as operations (docs/notifications.md).

1. A trigger wrote a ``NotificationEvent`` in the transaction that made it true
   (runtime.notify_events), or the sweeper did for an approval or wait about to expire
   (``expiry_notice_sweep``).
2. ``fan_out`` (after that commit: a worker on the hint, or the sweeper) writes one
   ``Notification`` per recipient and channel: the people whose role can act on it (policy:
   approvers for an approval, support staff for an unresolved operation, admins for an
   expiring wait or a failed task) and the task's watchers, on the channels they chose, due at
   once or when their quiet hours end; and every configured webhook.
3. ``dispatch_due`` hands due notifications to *one message per recipient, kind and channel
   at most every NOTIFY_DIGEST_SECONDS*: it locks the recipient's stream row, and a message
   sent less than that ago makes the newcomers wait for the next one (a digest). A message is
   an operation of the day's system notification task (never the subject task's: its budget,
   journal and completion stay its own), proposed with the key ``notice:<event>:<recipient>:
   <channel>`` (``runtime.keys.key_notice``), so the worker runs it like any effect: claimed
   under a lease, retried with backoff, its key passed to the receiver, nothing sent inside a
   transaction."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as dtime
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runtime.actors import SWEEPER, SYSTEM, Actor, actor_for_user
from runtime.errors import InvalidInput, NotAuthorized, NotFound
from runtime.ids import new_id
from runtime.keys import key_notice
from runtime.models import (
    Approval,
    AuditRecord,
    Notification,
    NotificationEndpoint,
    NotificationEvent,
    NotificationPreference,
    NotificationStream,
    NotificationTask,
    Operation,
    Task,
    TaskWatch,
)
from runtime.models.notifications import Channel, NotificationKind
from runtime.notify_events import notice_txn
from runtime.notify_secrets import (
    endpoint_secret,
    endpoints,
    url_hint,
    url_seal,
    url_validate,
)
from runtime.operations import OperationSpec, operation_propose_txn
from runtime.policy import (
    allowed,
    approval_decision_refusal,
    can_follow_task,
    can_manage_notification_endpoints,
    can_manage_waits,
    can_resolve,
    can_start_attempt,
    can_use_console,
    can_watch_task,
    fresh,
    notification_scope,
)
from runtime.rules.statuses import ApprovalStatus, OperationStatus
from runtime.tasks import TaskSpec, task_create, task_get

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


# --- the day's system task ------------------------------------------------------------------


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


# --- fan-out ---------------------------------------------------------------------------------


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


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def quiet_until(pref: NotificationPreference | None, now: datetime) -> datetime | None:
    """When ``now`` falls in the person's quiet hours, the moment they end; else None. Pure.
    A window whose start is after its end spans midnight (22:00-07:00)."""
    if pref is None or pref.quiet_start is None or pref.quiet_end is None:
        return None
    start, end = pref.quiet_start, pref.quiet_end
    if start == end:
        return None
    zone = _zone(pref.timezone)
    local = now.astimezone(zone)
    clock = local.time().replace(tzinfo=None)
    inside = start <= clock < end if start < end else clock >= start or clock < end
    if not inside:
        return None
    end_day = local.date() if clock < end else local.date() + timedelta(days=1)
    return datetime.combine(end_day, end, tzinfo=zone)


def _email_address(user: Any, pref: NotificationPreference | None) -> str:
    if pref is not None and not pref.email_enabled:
        return ""
    return (pref.email if pref is not None and pref.email else "") or (user.email or "")


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
        if not _email_address(users[person.user_id], pref):
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


# --- dispatch ---------------------------------------------------------------------------------


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
        address = _email_address(user, pref) if user is not None else ""
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


# --- reminders before expiry (the sweeper) ---------------------------------------------------


def expiry_notice_sweep(now: datetime | None = None, batch: int = 200) -> int:
    """Note approvals and signal waits that expire within NOTIFY_EXPIRY_WARNING_SECONDS (once
    per validity period: a renewal may be reminded again). Only those that lived past their
    warning point: a request shorter than the threshold was announced when it was made.
    Returns how many were noted now (those noted by an earlier sweep are not again)."""
    now = now or timezone.now()
    ahead = timedelta(seconds=settings.NOTIFY_EXPIRY_WARNING_SECONDS)
    due: list[tuple[str, str, dict[str, Any]]] = []
    for approval in Approval.objects.filter(
        status=ApprovalStatus.PENDING, expires_at__gt=now, expires_at__lte=now + ahead
    ).order_by("expires_at")[:batch]:
        if approval.created_at <= approval.expires_at - ahead:
            due.append(
                (
                    K.APPROVAL_EXPIRING,
                    f"{approval.pk}:{approval.expires_at.isoformat()}",
                    {
                        "task_id": approval.task_id,
                        "approval_id": approval.pk,
                        "operation_id": approval.operation_id,
                        "data": {
                            "expires_at": approval.expires_at.isoformat(),
                            "tool": approval.tool,
                        },
                    },
                )
            )
    for op in Operation.objects.filter(
        status=OperationStatus.WAITING,
        kind=Operation.KIND_WAIT_SIGNAL,
        wait_until__gt=now,
        wait_until__lte=now + ahead,
    ).order_by("wait_until")[:batch]:
        if op.wait_until is not None and op.created_at <= op.wait_until - ahead:
            due.append(
                (
                    K.WAIT_EXPIRING,
                    f"{op.pk}:{op.wait_until.isoformat()}",
                    {
                        "task_id": op.task_id,
                        "operation_id": op.pk,
                        "data": {"expires_at": op.wait_until.isoformat(), "signal": op.signal},
                    },
                )
            )
    if not due:
        return 0
    # Noted by an earlier sweep: not again (and no hint for nothing new).
    seen = set(
        NotificationEvent.objects.filter(
            dedupe__in=[f"{kind}:{dedupe}" for kind, dedupe, _ in due]
        ).values_list("dedupe", flat=True)
    )
    fresh_due = [d for d in due if f"{d[0]}:{d[1]}" not in seen]
    with transaction.atomic():
        for kind, dedupe, fields in fresh_due:
            notice_txn(kind, dedupe, actor=SWEEPER, now=now, **fields)
    return len(fresh_due)


# --- people: preferences, watching -----------------------------------------------------------


def _person(actor: Actor) -> int:
    can_use_console(actor)
    if actor.user_id is None:
        raise NotAuthorized("notification settings belong to people")
    return actor.user_id


def preference_get(actor: Actor) -> NotificationPreference:
    """The person's choices, or the defaults (email on, the account's address, no quiet hours)."""
    user_id = _person(actor)
    found = NotificationPreference.objects.filter(user_id=user_id).first()
    return found or NotificationPreference(user_id=user_id, updated_at=timezone.now())


def preference_save(
    actor: Actor,
    *,
    email_enabled: bool,
    email: str,
    quiet_start: dtime | None,
    quiet_end: dtime | None,
    tz: str,
) -> NotificationPreference:
    """Save the person's own choices. Quiet hours need both ends (or neither)."""
    user_id = _person(actor)
    if (quiet_start is None) != (quiet_end is None):
        raise InvalidInput("quiet hours need a start and an end", field="quiet_start")
    try:
        ZoneInfo(tz or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"unknown time zone {tz!r}", field="timezone") from None
    email = (email or "").strip()
    if email and ("@" not in email or len(email) > 254 or any(c.isspace() for c in email)):
        raise InvalidInput("email must be an address", field="email")
    pref, _ = NotificationPreference.objects.update_or_create(
        user_id=user_id,
        defaults={
            "email_enabled": email_enabled,
            "email": email,
            "quiet_start": quiet_start,
            "quiet_end": quiet_end,
            "timezone": tz or "UTC",
            "updated_at": timezone.now(),
        },
    )
    return pref


def task_watch_set(actor: Actor, task_id: str, *, watch: bool) -> bool:
    """Start or stop watching a task (its watchers hear of its notifications); returns whether
    the person watches it now."""
    task = task_get(actor, task_id)
    can_watch_task(actor, task)
    user_id = _person(actor)
    if watch:
        TaskWatch.objects.bulk_create(
            [TaskWatch(task=task, user_id=user_id, created_at=timezone.now())],
            ignore_conflicts=True,
        )
    else:
        TaskWatch.objects.filter(task=task, user_id=user_id).delete()
    return watch


def task_watching(actor: Actor, task_id: str) -> bool:
    return TaskWatch.objects.filter(task_id=task_id, user_id=actor.user_id or 0).exists()


# --- admins: webhooks --------------------------------------------------------------------------


def endpoint_create(
    actor: Actor, *, name: str, url: str, fmt: str, kinds: list[str]
) -> tuple[NotificationEndpoint, str]:
    """An admin adds a webhook (``fmt`` webhook, signed; or slack). Returns the endpoint and,
    for a signed webhook, its signing secret: shown this once, never stored (derived)."""
    can_manage_notification_endpoints(actor)
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidInput("name is required (at most 100 characters)", field="name")
    if fmt not in (Channel.WEBHOOK, Channel.SLACK):
        raise InvalidInput("format must be webhook or slack", field="format")
    url = url_validate(url)
    unknown = set(kinds) - set(K.ALL)
    if unknown:
        raise InvalidInput(f"unknown kinds: {', '.join(sorted(unknown))}", field="kinds")
    now = timezone.now()
    with transaction.atomic():
        endpoint = NotificationEndpoint.objects.create(
            id=new_id("nep"),
            name=name,
            format=fmt,
            url_sealed=url_seal(url),
            url_hint=url_hint(url),
            kinds=sorted(set(kinds)),
            created_by=actor.label,
            created_at=now,
        )
        _endpoint_audit_txn(actor, "endpoint.added", endpoint, now)
    secret = (
        endpoint_secret(endpoint.pk, endpoint.secret_version).decode()
        if fmt == Channel.WEBHOOK
        else ""
    )
    return endpoint, secret


def endpoint_remove(actor: Actor, endpoint_id: str) -> None:
    can_manage_notification_endpoints(actor)
    with transaction.atomic():
        endpoint = (
            NotificationEndpoint.objects.select_for_update()
            .filter(pk=endpoint_id, active=True)
            .first()
        )
        if endpoint is None:
            raise NotFound("no such endpoint")
        NotificationEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
        _endpoint_audit_txn(actor, "endpoint.removed", endpoint, timezone.now())


def _endpoint_audit_txn(
    actor: Actor, action: str, endpoint: NotificationEndpoint, now: datetime
) -> None:
    """Who changed where notifications go (they carry links to approvals): an access change,
    kept with the tokens' in the audit records, never the URL itself (sealed)."""
    AuditRecord.objects.create(
        at=now,
        actor=actor.label,
        action=action,
        subject=f"endpoint:{endpoint.pk}",
        detail={"name": endpoint.name, "format": endpoint.format, "url": endpoint.url_hint},
    )


def endpoint_list(actor: Actor) -> list[NotificationEndpoint]:
    can_manage_notification_endpoints(actor)
    return list(NotificationEndpoint.objects.filter(active=True).order_by("created_at"))


# --- the delivery page ------------------------------------------------------------------------


def notification_list(actor: Actor, *, limit: int = 100) -> list[Notification]:
    """Recent notifications the person may see (their own; admins every one, webhooks
    included), newest first, with their message's operation."""
    can_use_console(actor)
    return list(
        Notification.objects.filter(notification_scope(fresh(actor)))
        .select_related("event", "operation")
        .order_by("-created_at", "-id")[:limit]
    )


def env_endpoints_summary() -> list[dict[str, str]]:
    """The environment's endpoints, for the settings page (hosts only, never a secret)."""
    return [
        {"id": e.id, "name": e.name, "format": e.format, "hint": url_hint(e.url)}
        for e in endpoints()
        if e.id.startswith("env-")
    ]
