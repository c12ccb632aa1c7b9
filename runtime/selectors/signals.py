"""Reads of signals (selectors): a task's signals as received, with their dispositions."""

from __future__ import annotations

from runtime.models import Signal


def signals_of_task(task_id: str, limit: int = 200) -> list[Signal]:
    """The task's signals, oldest first. Preconditions: the caller may see the task."""
    return list(Signal.objects.filter(task_id=task_id).order_by("received_at", "id")[:limit])
