"""The pages for finding things (issue 24: an operation's page, the tool catalogue, the task
list searched by an id) cost a number of queries that does not grow with the rows they show:
measured with 2 rows of each part and with 6, the counts are equal (tests/api/test_query_counts
does the same for the other pages)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime.models import Event, Invocation, Operation, RejectedObservation, Resolution
from tests import factories

pytestmark = pytest.mark.django_db


def _queries(call: Callable[[], Any]) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = call()
    assert response.status_code == 200, getattr(response, "content", b"")[:300]
    return len(ctx.captured_queries)


def _grow(op: Operation, start: int, n: int) -> None:
    """``n`` more invocations (each under its own lease generation), refused reports, journal
    entries and resolutions for ``op``."""
    now = timezone.now()
    last = Event.objects.filter(task_id=op.task_id).order_by("-seq").first()
    seq = last.seq if last else 0
    for i in range(start, start + n):
        Invocation.objects.create(
            operation=op, number=i, lease_generation=i, started_at=now, outcome="lost"
        )
        RejectedObservation.objects.create(
            operation=op, kind="stale_completion", lease_generation=i
        )
        seq += 1
        Event.objects.create(
            task_id=op.task_id,
            seq=seq,
            type="operation.lease_expired",
            at=now,
            state_version=1,
            operation=op,
            actor="system:sweeper",
            data={"from": "running", "to": "pending"},
        )
        Resolution.objects.create(
            operation=op,
            actor="user:s",
            resolution="retry_same_key",
            evidence="e",
            from_status="unresolved",
            to_status="pending",
            state_version=1,
            at=now,
        )


def test_the_operation_page_and_the_search_do_not_grow_with_their_rows():
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 1000})
    op = factories.operation(owner, task, step="s", estimate={"cost_cents": 10})
    admin = factories.console_user("admin")
    browser = Client()
    browser.force_login(get_user_model().objects.get(pk=admin.actor.user_id))
    pages = {
        "operation": lambda: browser.get(f"/operations/{op.pk}/"),
        "tools": lambda: browser.get("/tools/"),
        "search by operation id": lambda: browser.get("/tasks/", {"q": op.pk}),
        "search by key": lambda: browser.get("/tasks/", {"q": op.idempotency_key}),
    }
    for call in pages.values():
        call()  # warm: sessions, roles
    _grow(op, 1, 2)
    for _ in range(2):
        factories.task(owner)
    small = {name: _queries(call) for name, call in pages.items()}
    _grow(op, 3, 4)
    for _ in range(4):
        factories.operation(owner, factories.task(owner))
    large = {name: _queries(call) for name, call in pages.items()}
    growing = {name: (small[name], large[name]) for name in small if small[name] != large[name]}
    assert not growing, f"queries (2 rows, 6 rows) grow with the rows: {growing}"
    assert large["tools"] <= small["operation"], large
