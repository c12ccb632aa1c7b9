"""Reads of notifications (selectors): the delivery page's rows, a person's preferences and
watches, the configured endpoints."""

from __future__ import annotations

from django.utils import timezone

from runtime.actors import Actor
from runtime.errors import NotAuthorized
from runtime.models import Notification, NotificationEndpoint, NotificationPreference, TaskWatch
from runtime.notify_secrets import endpoints, url_hint
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
