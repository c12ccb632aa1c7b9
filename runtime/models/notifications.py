"""Notifications: telling people (and the deployment's webhooks) where they are needed.

A trigger writes a ``NotificationEvent`` in the transaction that made the situation true (an
approval requested, a task failed, an operation unresolved) or the sweeper writes it (an
approval or wait about to expire); its ``dedupe`` is unique, so an event is recorded once. The
fan-out, after that commit, writes one ``Notification`` per recipient and channel (unique), and
the dispatch hands due notifications to a notification *operation* (runtime/tools/notify.py),
one per message: a digest covers the several notifications one message carries."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime.ids import new_id


def _event_id() -> str:
    return new_id("nev")


def _notification_id() -> str:
    return new_id("ntf")


class NotificationKind:
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_EXPIRING = "approval_expiring"
    WAIT_EXPIRING = "wait_expiring"
    OPERATION_UNRESOLVED = "operation_unresolved"
    TASK_FAILED = "task_failed"
    ALL = (APPROVAL_REQUESTED, APPROVAL_EXPIRING, WAIT_EXPIRING, OPERATION_UNRESOLVED, TASK_FAILED)


class Channel:
    EMAIL = "email"
    WEBHOOK = "webhook"
    SLACK = "slack"
    ALL = (EMAIL, WEBHOOK, SLACK)


class NotificationEvent(models.Model):
    """Something people should hear of, recorded once (``dedupe``) where it happened."""

    id = models.CharField(primary_key=True, max_length=40, default=_event_id, editable=False)
    kind = models.CharField(max_length=32)
    # One event per situation: "approval_requested:apr_...", "task_failed:tsk_...".
    dedupe = models.CharField(max_length=300, unique=True)
    task = models.ForeignKey(
        "runtime.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    approval = models.ForeignKey(
        "runtime.Approval", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    # Set once its notifications are written (the fan-out); the sweeper fans out what is left.
    fanned_out_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=NotificationKind.ALL), name="notif_event_kind_valid"
            ),
            models.CheckConstraint(condition=~models.Q(actor=""), name="notif_event_actor"),
        ]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="notif_event_unfanned",
                condition=models.Q(fanned_out_at__isnull=True),
            ),
        ]


class NotificationEndpoint(models.Model):
    """A webhook an admin configured in the console (the environment's NOTIFY_WEBHOOK_URL and
    NOTIFY_SLACK_WEBHOOK_URL are endpoints too, without a row). The URL is kept sealed
    (runtime.notify_secrets: a Slack URL is itself a credential); the signing secret is not
    stored at all: it is derived from the server's keys, the endpoint and its secret version,
    and shown to the admin once."""

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    name = models.CharField(max_length=100)
    format = models.CharField(max_length=16, default=Channel.WEBHOOK)
    url_sealed = models.TextField()
    # Where it posts, for people (scheme, host, port): the full URL is never shown again.
    url_hint = models.CharField(max_length=300)
    kinds = models.JSONField(default=list, blank=True)  # empty: every kind
    secret_version = models.PositiveIntegerField(default=1)
    active = models.BooleanField(default=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(format__in=(Channel.WEBHOOK, Channel.SLACK)),
                name="notif_endpoint_format_valid",
            ),
        ]


class Notification(models.Model):
    """One event for one recipient on one channel. ``due_at`` is when it may be sent (later in
    quiet hours, or when the recipient's last message of this kind was under a minute ago);
    ``operation`` is the message that carried it (shared by the notifications of a digest)."""

    id = models.CharField(primary_key=True, max_length=40, default=_notification_id, editable=False)
    event = models.ForeignKey(NotificationEvent, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32)
    # "user:<id>" or "endpoint:<id>" ("endpoint:env-webhook", "endpoint:env-slack").
    recipient = models.CharField(max_length=100)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    channel = models.CharField(max_length=16)
    # Why this recipient: the role that can act, or "watcher", or "endpoint".
    reason = models.CharField(max_length=32)
    due_at = models.DateTimeField()
    # Held by quiet hours (the page says so); a digest may still carry it once they end.
    held = models.CharField(max_length=32, blank=True, default="")
    operation = models.ForeignKey(
        "runtime.Operation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["event", "recipient", "channel"], name="notification_once"
            ),
            models.CheckConstraint(
                condition=models.Q(channel__in=Channel.ALL), name="notification_channel_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["due_at"],
                name="notification_due",
                condition=models.Q(operation__isnull=True),
            ),
            models.Index(fields=["recipient", "-created_at"], name="notification_recipient"),
            models.Index(fields=["-created_at", "-id"], name="notification_recent"),
        ]


class NotificationStream(models.Model):
    """A recipient's messages of one kind on one channel: the row the dispatch locks, whose
    ``last_sent_at`` keeps it to one message per NOTIFY_DIGEST_SECONDS (a digest folds the
    rest)."""

    recipient = models.CharField(max_length=100)
    channel = models.CharField(max_length=16)
    kind = models.CharField(max_length=32)
    last_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["recipient", "channel", "kind"], name="notification_stream_unique"
            )
        ]


class NotificationPreference(models.Model):
    """A person's choices (/settings/notifications/): channels, an address, quiet hours."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    email_enabled = models.BooleanField(default=True)
    # Empty: the account's own address.
    email = models.EmailField(blank=True, default="")
    # Quiet hours in the person's time zone (start after end spans midnight); null: none.
    quiet_start = models.TimeField(null=True, blank=True)
    quiet_end = models.TimeField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    updated_at = models.DateTimeField()


class NotificationTask(models.Model):
    """The system task that holds one UTC day's notification operations (never a subject
    task's: its budget, journal and completion stay its own)."""

    day = models.DateField(unique=True)
    task = models.OneToOneField("runtime.Task", on_delete=models.PROTECT, related_name="+")


class TaskWatch(models.Model):
    """A person who asked to hear of a task (its page's Watch button)."""

    task = models.ForeignKey("runtime.Task", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "user"], name="task_watch_once"),
        ]
