"""Idempotency key domains (one per kind of intent, so keys of different kinds never collide).
A key is made once, before the first call, and never changed to get past an ambiguous result."""

from __future__ import annotations


def key_step(
    task_id: str, step: str, resource: str, intent_version: int, *, attempt: int = 1
) -> str:
    """A step's side effect: business instance (+ attempt from the second on: a new pursuit is
    not a recovery) + step + resource + intent version."""
    instance = task_id if attempt <= 1 else f"{task_id}:a{attempt}"
    return f"{instance}:{step}:{resource}:v{intent_version}"


def key_trigger(source: str, event_id: str) -> str:
    """Trigger deduplication: the source and its own event id."""
    return f"trigger:{source}:{event_id}"


def key_compensation(original_key: str, compensating_tool: str, compensation_version: int) -> str:
    """Compensation of one original effect: the original's own key (task, step, resource and
    intent version, so two effects of one step never share a compensation key), the
    compensating tool, and the compensation's version (a second compensation of the same
    effect, after the first was settled as having no effect, is a new intent)."""
    return f"{original_key}:compensate:{compensating_tool}:v{compensation_version}"


def key_notification(task_id: str, kind: str, recipient: str, version: int) -> str:
    """A notification: instance + notification type + recipient target + version."""
    return f"{task_id}:notify:{kind}:{recipient}:v{version}"
