"""Idempotency key domains (one per kind of intent, so keys of different kinds never collide).
A key is made once, before the first call, and never changed to get past an ambiguous result."""

from __future__ import annotations


def key_step(task_id: str, step: str, resource: str, intent_version: int) -> str:
    """A step's side effect: business instance + step + resource + intent version."""
    return f"{task_id}:{step}:{resource}:v{intent_version}"


def key_trigger(source: str, event_id: str) -> str:
    """Trigger deduplication: the source and its own event id."""
    return f"trigger:{source}:{event_id}"


def key_compensation(task_id: str, original_step: str, compensation_version: int = 1) -> str:
    """Compensation of one original step."""
    return f"{task_id}:{original_step}:compensate:v{compensation_version}"


def key_notification(task_id: str, kind: str, recipient: str, version: int) -> str:
    """A notification: instance + notification type + recipient target + version."""
    return f"{task_id}:notify:{kind}:{recipient}:v{version}"
