"""Reads of notifications (selectors): the delivery page's rows, a person's preferences and
watches, the configured endpoints."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import NotAuthorized
from runtime.models import Notification, NotificationEndpoint, NotificationPreference, TaskWatch
from runtime.notify_secrets import ENV_SLACK, ENV_WEBHOOK, endpoints, url_hint
from runtime.policy import can_use_console, fresh
from runtime.policy_features import can_manage_notification_endpoints, notification_scope


def person_of(actor: Actor) -> int:
    """The person's user id: notification settings belong to people, never to an agent."""
    can_use_console(actor)
    if actor.user_id is None:
        raise NotAuthorized("notification settings belong to people")
    return actor.user_id


def preference_get(actor: Actor) -> NotificationPreference:
    """The person's choices, or the defaults (email on, the account's address, no quiet hours)."""
    user_id = person_of(actor)
    found = NotificationPreference.objects.filter(user_id=user_id).first()
    return found or NotificationPreference(user_id=user_id, updated_at=timezone.now())


def task_watching(actor: Actor, task_id: str) -> bool:
    return TaskWatch.objects.filter(task_id=task_id, user_id=actor.user_id or 0).exists()


def endpoint_list(actor: Actor) -> list[NotificationEndpoint]:
    can_manage_notification_endpoints(actor)
    return list(NotificationEndpoint.objects.filter(active=True).order_by("created_at"))


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


_ENV_NAMES = {
    ENV_WEBHOOK: "the webhook NOTIFY_WEBHOOK_URL",
    ENV_SLACK: "the Slack webhook NOTIFY_SLACK_WEBHOOK_URL",
}


def recipient_names(rows: list[Notification]) -> dict[str, str]:
    """Each recipient of ``rows`` ("user:<id>", "endpoint:<id>") as people know it: the
    person's username, the webhook's name ("(removed)" once it was), the environment's
    variable. Two statements whatever the number of rows."""
    users = {r.recipient.partition(":")[2] for r in rows if r.recipient.startswith("user:")}
    hooks = {r.recipient.partition(":")[2] for r in rows if r.recipient.startswith("endpoint:")}
    names = {
        f"user:{pk}": username
        for pk, username in get_user_model()
        .objects.filter(pk__in=[int(u) for u in users if u.isdigit()])
        .values_list("pk", "username")
    }
    for pk, name, active in NotificationEndpoint.objects.filter(pk__in=hooks).values_list(
        "pk", "name", "active"
    ):
        names[f"endpoint:{pk}"] = f"the webhook {name}" + ("" if active else " (removed)")
    for pk, name in _ENV_NAMES.items():
        names[f"endpoint:{pk}"] = name
    return names


def delivery_reason(row: Notification) -> str:
    """Why a delivery is not (yet) done, in the words of its operation's error (the receiver's
    answer, the address guard's refusal, the mail server's), else its status reason."""
    op = row.operation
    if op is None:
        return ""
    error = op.error if isinstance(op.error, dict) else {}
    return str(error.get("message") or op.status_reason or "")
