"""The sweeper republishes announcements nobody consumed, but each one later than the last time:
under a backlog whose messages still sit in the broker, it must not add copies faster than the
workers drain them."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.models import OutboxMessage
from runtime.outbox import outbox_sweep
from tests import factories

pytestmark = pytest.mark.django_db


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
