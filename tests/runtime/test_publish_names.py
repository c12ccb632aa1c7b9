"""The modules that announce work publish by task name (runtime.publish) and never import the
Celery tasks (tests/layers.py holds that no module imports runtime.worker); the names must be
the worker's registered tasks, or every announcement would be a message nobody consumes."""

from __future__ import annotations

import uuid

import pytest
import redis
from celery import current_app
from django.conf import settings

import runtime.worker  # noqa: F401  (registers the shared tasks)
from runtime.publish import TASK_NAMES, WAKE_WAIT, publish


def test_every_published_name_is_a_registered_task():
    registered = set(current_app.tasks.keys())
    assert set(TASK_NAMES) <= registered, set(TASK_NAMES) - registered


@pytest.mark.postgres
def test_a_message_is_one_push_onto_its_queue_with_no_declaration():
    """A Redis queue is the list its first push creates: publishing declares nothing (kombu's
    declaration, bindings and a length read, had cost a round trip whenever its cache missed)."""
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    queue = f"test-publish-{uuid.uuid4().hex[:8]}"
    try:
        publish(WAKE_WAIT, "op-x", queue=queue)
        assert client.llen(queue) == 1
        assert not client.exists(f"_kombu.binding.{queue}")
    finally:
        client.delete(queue, f"_kombu.binding.{queue}")
