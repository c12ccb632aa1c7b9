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


# --- namespaces ---------------------------------------------------------------------------
# Keys leave the system (receivers dedupe by them), so a key is prefixed by the owner of the
# task it belongs to: one agent can neither read, replay nor squat another's keys at a
# receiver. The operation's stored ``idempotency_key`` is the namespaced key; adapters pass it
# unchanged.

NAMESPACE_SEPARATOR = "/"
_NAMESPACE_KINDS = ("agt_", "usr_", "sys_")


def key_namespace(*, agent_id: str | None, user_id: int | None) -> str:
    """The namespace of a task's keys: its agent's, or the creating user's for a user's task."""
    if agent_id:
        return agent_id
    if user_id is not None:
        return f"usr_{user_id}"
    return "sys_runtime"


def key_in_namespace(namespace: str, key: str) -> str:
    """``key`` inside ``namespace``. A key already inside it (one read back from an operation)
    is kept as it is; a key inside another namespace raises ValueError."""
    head, sep, _ = key.partition(NAMESPACE_SEPARATOR)
    if sep and head == namespace:
        return key
    if sep and head.startswith(_NAMESPACE_KINDS):
        raise ValueError("the key is inside another owner's namespace")
    return f"{namespace}{NAMESPACE_SEPARATOR}{key}"


def key_namespace_of(key: str) -> str:
    """The namespace a namespaced key lives in ("" for a key without one)."""
    head, sep, _ = key.partition(NAMESPACE_SEPARATOR)
    return head if sep else ""
