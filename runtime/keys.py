"""Idempotency key domains (one per kind of intent, so keys of different kinds never collide).
A key is made once, before the first call, and never changed to get past an ambiguous result.

A derived key is a ``:``-separated list of fields whose literal fields (``notify``,
``compensate``, ``a2``, ``v1``) say its domain; every variable part (task id, step, tool,
recipient, source, event id) is escaped first (``%`` -> ``%25``, ``:`` -> ``%3A``, ``/`` ->
``%2F``), so no part can supply a separator or a namespace and a key has exactly one reading.
A part holding none of those characters is unchanged: such keys are byte for byte what they were
before escaping. A key derived before escaping existed (``key_legacy``) is still found for the
same task, step and tool by the proposal (runtime.transitions.propose)."""

from __future__ import annotations

import re

_ESCAPES = (("%", "%25"), (":", "%3A"), ("/", "%2F"))


def _part(value: object) -> str:
    """One variable part of a key, escaped (``%`` first, so an escape is never escaped twice)."""
    text = str(value)
    for raw, escaped in _ESCAPES:
        text = text.replace(raw, escaped)
    return text


def key_legacy(key: str) -> str:
    """The key ``key`` (a derived one) had before parts were escaped: the parts joined as they
    were. Undoing the three escapes of the whole key gives it, separators being unescaped."""
    # One pass, so "%253A" (an escaped "%3A") becomes "%3A", not ":".
    return re.sub("%(25|3A|2F)", lambda m: {"25": "%", "3A": ":", "2F": "/"}[m.group(1)], key)


def _instance(task_id: str, attempt: int) -> str:
    # A new attempt is a new pursuit, not a recovery: its keys carry the attempt number.
    return _part(task_id) if attempt <= 1 else f"{_part(task_id)}:a{attempt}"


def key_step(
    task_id: str, step: str, resource: str, intent_version: int, *, attempt: int = 1
) -> str:
    """A step's side effect: business instance (+ attempt from the second on: a new pursuit is
    not a recovery) + step + resource + intent version."""
    return f"{_instance(task_id, attempt)}:{_part(step)}:{_part(resource)}:v{intent_version}"


def key_trigger(source: str, event_id: str) -> str:
    """Trigger deduplication: the source and its own event id."""
    return f"trigger:{_part(source)}:{_part(event_id)}"


def key_compensation(original_key: str, compensating_tool: str, compensation_version: int) -> str:
    """Compensation of one original effect: the original's own key (task, step, resource and
    intent version, so two effects of one step never share a compensation key), the
    compensating tool, and the compensation's version (a second compensation of the same
    effect, after the first was settled as having no effect, is a new intent). The original
    key is kept as stored (it may carry its namespace), not escaped."""
    return f"{original_key}:compensate:{_part(compensating_tool)}:v{compensation_version}"


def key_check(task_id: str, check: str, hexdigest: str, attempt: int = 1) -> str:
    """A required check's run as an operation: one per check, subject digest and attempt (a new
    attempt checks the same bytes anew). The layout of keys made before parts were escaped."""
    suffix = f":a{attempt}" if attempt > 1 else ""
    return f"{_part(task_id)}:check:{_part(check)}:{_part(hexdigest)}{suffix}"


def key_notification(
    task_id: str, kind: str, recipient: str, version: int, *, attempt: int = 1
) -> str:
    """A notification: instance + notification type + recipient target + version."""
    return f"{_instance(task_id, attempt)}:notify:{_part(kind)}:{_part(recipient)}:v{version}"


def key_notice(subject: str, recipient: str, channel: str) -> str:
    """A notification message: one per event (or, for a digest, the first notification it
    folds), recipient and channel, in the system's notification tasks (runtime.notifications).
    Its own domain (``notice``), so no step, check or compensation key can take its shape."""
    return f"notice:{_part(subject)}:{_part(recipient)}:{_part(channel)}"


# A caller's own key may not take a derived key's shape (a task id or "trigger" as its first
# field): otherwise an agent could take, ahead of it, the key a step, a notification or a
# saga's compensation derives, and that intent would be refused as a reuse of the key.
_DERIVED_HEAD = re.compile(r"(tsk_[^:/]*|trigger|notice):")


def given_key_check(key: str) -> str:
    """A caller-supplied idempotency key (with or without its namespace), returned unchanged;
    ValueError when it has the shape of a derived key, whose domains it may not enter."""
    head, sep, rest = key.partition(NAMESPACE_SEPARATOR)
    bare = rest if sep and head.startswith(_NAMESPACE_KINDS) else key
    if _DERIVED_HEAD.match(bare):
        raise ValueError(
            "idempotency_key must not start with a task id, 'trigger' or 'notice' and ':' "
            "(the shape of the keys the runtime derives)"
        )
    return key


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
