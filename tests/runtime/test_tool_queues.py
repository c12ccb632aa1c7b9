"""A queue per tool class (TOOL_QUEUES): an operation of a class with a queue of its own is
published there and run by the workers that read it; every other class stays on the default
queue, so a pool of slow tools cannot hold up quick ones."""

from __future__ import annotations

import os

import pytest
import redis

from runtime.models import Operation
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]


def _status(op: Operation) -> str:
    return Operation.objects.values_list("status", flat=True).get(pk=op.pk)


def test_a_tool_class_with_its_own_queue_is_run_by_that_queues_workers_only(workers, settings):
    slow_queue = f"{settings.CELERY_QUEUE}-slow"
    settings.TOOL_QUEUES = {"demo.slow": slow_queue}
    routes = f"demo.slow={slow_queue}"
    workers.start(queues=slow_queue, TOOL_QUEUES=routes)
    owner = factories.agent()
    task = factories.task(owner)
    slow = factories.operation(owner, task, tool="demo.slow", params={"seconds": 0})
    echo = factories.operation(owner, task, params={"n": 1})

    wait_for(lambda: _status(slow) == "succeeded", timeout=60, what="the routed operation")
    # The other class's announcement waits on the default queue, which this pool does not read.
    broker = redis.Redis.from_url(os.environ["REDIS_URL"])
    assert broker.llen(settings.CELERY_QUEUE) == 1
    assert _status(echo) == "pending"

    workers.start(queues=settings.CELERY_QUEUE, TOOL_QUEUES=routes)
    wait_for(lambda: _status(echo) == "succeeded", timeout=60, what="the default queue's work")
    assert broker.llen(slow_queue) == 0
