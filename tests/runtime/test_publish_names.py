"""The modules that announce work publish by task name (runtime.publish) and never import the
Celery tasks (tests/layers.py holds that no module imports runtime.worker); the names must be
the worker's registered tasks, or every announcement would be a message nobody consumes."""

from __future__ import annotations

from celery import current_app

import runtime.worker  # noqa: F401  (registers the shared tasks)
from runtime.publish import TASK_NAMES


def test_every_published_name_is_a_registered_task():
    registered = set(current_app.tasks.keys())
    assert set(TASK_NAMES) <= registered, set(TASK_NAMES) - registered
