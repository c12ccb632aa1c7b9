"""The sweeper republishes announcements nobody consumed, but each one later than the last time,
and only those the broker can no longer hold: under a backlog whose messages still sit in the
broker, copies would only be more deliveries for the workers to refuse."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone

from runtime import outbox
from runtime.drainers import Registration
from runtime.models import OutboxMessage
from runtime.outbox import outbox_publish, outbox_sweep
from tests import factories

pytestmark = pytest.mark.django_db


def _queues_emptied() -> None:
    if django_settings.REDIS_URL:
        client = redis.Redis.from_url(str(django_settings.REDIS_URL))
        for queue in django_settings.CELERY_QUEUES:
            client.delete(queue, f"drain:{queue}", f"drain1:{queue}", f"drainers:{queue}")


@pytest.fixture(autouse=True)
def _broker_empty() -> Iterator[None]:
    """No other test's messages wait in the broker, and no sweep here has seen it yet."""
    _queues_emptied()
    outbox._drained_at.clear()
    yield
    _queues_emptied()
    outbox._drained_at.clear()


def test_an_unconsumed_announcement_is_republished_with_growing_pauses(settings):
    settings.OUTBOX_GRACE_SECONDS = 10
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    message = OutboxMessage.objects.get(operation=op)
    t = message.available_at

    republished_at = []
    for second in range(0, 400):
        now = t + timedelta(seconds=second)
        if outbox_sweep(now=now):
            republished_at.append(second)
            _queues_emptied()  # each copy is lost too
    # Due after the grace (10 s), then after 20, 40, 80, 160 s more: never every sweep.
    gaps = [b - a for a, b in itertools.pairwise(republished_at)]
    assert republished_at[0] == 10
    assert gaps == [20, 40, 80, 160]
    assert OutboxMessage.objects.get(pk=message.pk).publish_count == 5


def test_a_consumed_announcement_is_never_republished(settings):
    settings.OUTBOX_GRACE_SECONDS = 1
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    OutboxMessage.objects.filter(operation=op).delete()  # what a claim does
    assert outbox_sweep(now=timezone.now() + timedelta(hours=1)) == 0


@pytest.mark.postgres
def test_an_announcement_still_waiting_in_the_broker_is_not_copied(settings):
    """A backlog: the message is queued behind others, its row stale. The sweep copies it only
    once its queue was seen empty (a restarted Redis holds nothing), and then once."""
    settings.OUTBOX_GRACE_SECONDS = 1
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    message = OutboxMessage.objects.get(operation=op)
    assert outbox_publish([message]) == 1
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    assert client.llen(settings.CELERY_QUEUE) == 1
    later = timezone.now() + timedelta(hours=1)
    assert outbox_sweep(now=later) == 0
    assert client.llen(settings.CELERY_QUEUE) == 1
    client.delete(settings.CELERY_QUEUE)  # lost with Redis
    assert outbox_sweep(now=later + timedelta(seconds=1)) == 1
    assert client.llen(settings.CELERY_QUEUE) == 1
    assert OutboxMessage.objects.get(pk=message.pk).publish_count == 1


@pytest.mark.postgres
def test_ids_on_a_drain_list_wait_only_while_a_drainer_is_registered(settings):
    """A proposal left to a drainer is on its queue's drain list: not lost while the drainer is
    registered, lost once its registration lapsed (a killed drainer), and then copied."""
    settings.OUTBOX_GRACE_SECONDS = 1
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    queue = settings.CELERY_QUEUE
    client.rpush(f"drain1:{queue}", op.pk)
    registration = Registration(queue)
    assert registration.renew()
    later = timezone.now() + timedelta(hours=1)
    assert outbox_sweep(now=later) == 0
    registration.leave()  # as its lapse would
    assert outbox_sweep(now=later + timedelta(seconds=1)) == 1
    assert client.llen(queue) == 1
