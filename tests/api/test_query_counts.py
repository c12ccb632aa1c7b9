"""Every list and detail endpoint and page costs a number of queries that does not grow with
the rows it shows (no N+1): measured with 2 rows and with 6, the counts are equal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runtime.models import Invocation, Operation
from tests import factories

pytestmark = pytest.mark.django_db


def _queries(call: Callable[[], Any]) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = call()
    assert response.status_code == 200, getattr(response, "content", b"")[:300]
    return len(ctx.captured_queries)


def _world(rows: int) -> dict[str, Any]:
    """An agent with ``rows`` tasks, the last of which has ``rows`` operations, each with an
    invocation and some unresolved, plus a support person and an admin."""
    owner = factories.agent()
    tasks = [factories.task(owner, name=f"t{n}") for n in range(rows)]
    task = tasks[-1]
    ops = [factories.operation(owner, task, params={"n": n}) for n in range(rows)]
    for n, op in enumerate(ops):
        Invocation.objects.create(
            operation=op, number=1, lease_generation=1, started_at=op.created_at, outcome="lost"
        )
        if n % 2:
            Operation.objects.filter(pk=op.pk).update(status="unresolved")
    admin = factories.console_user("admin")
    browser = Client()
    from django.contrib.auth import get_user_model

    browser.force_login(get_user_model().objects.get(pk=admin.actor.user_id))
    # First uses (a token's last-use touch, the brute-force counters' rows) are not per-row work.
    for principal in (owner, admin):
        assert principal.client().get("/api/v1/tasks").status_code == 200
    return {"owner": owner, "task": task, "op": ops[0], "admin": admin, "browser": browser}


REQUESTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "GET /api/v1/tasks": lambda w: w["owner"].client().get("/api/v1/tasks"),
    "GET /api/v1/tasks/{id}": lambda w: w["owner"].client().get(f"/api/v1/tasks/{w['task'].pk}"),
    "GET /api/v1/tasks/{id}/operations": lambda w: (
        w["owner"].client().get(f"/api/v1/tasks/{w['task'].pk}/operations")
    ),
    "GET /api/v1/operations": lambda w: w["owner"].client().get("/api/v1/operations"),
    "GET /api/v1/operations?status=unresolved": lambda w: (
        w["admin"].client().get("/api/v1/operations?status=unresolved")
    ),
    "GET /api/v1/operations/{id}": lambda w: (
        w["owner"].client().get(f"/api/v1/operations/{w['op'].pk}")
    ),
    "GET /api/v1/tasks/{id}/events": lambda w: (
        w["owner"].client().get(f"/api/v1/tasks/{w['task'].pk}/events")
    ),
    "page /": lambda w: w["browser"].get("/"),
    "page /tasks/": lambda w: w["browser"].get("/tasks/"),
    "page /tasks/{id}/": lambda w: w["browser"].get(f"/tasks/{w['task'].pk}/"),
    "fragment /tasks/{id}/live": lambda w: w["browser"].get(f"/tasks/{w['task'].pk}/live"),
    "page /unresolved/": lambda w: w["browser"].get("/unresolved/"),
}


def test_queries_do_not_grow_with_rows():
    small_world, large_world = _world(2), _world(6)
    growing = {}
    for name, request in sorted(REQUESTS.items()):
        small = _queries(lambda r=request: r(small_world))
        large = _queries(lambda r=request: r(large_world))
        if small != large:
            growing[name] = (small, large)
    assert not growing, f"queries (2 rows, 6 rows) grow with the rows: {growing}"


def _gated_and_expired(owner, task, n: int) -> None:
    """``n`` pending approval requests, ``n`` expired ones and ``n`` expired signal waits."""
    from django.utils import timezone

    from runtime.approvals import approval_expire_sweep
    from runtime.models import Approval
    from runtime.waits import wait_sweep

    for i in range(n):
        for state in ("pending", "expired"):
            gated = factories.operation(
                owner,
                task,
                tool="demo.payments.charge",
                params={"account": f"{state}-{i}", "amount_cents": 20000 + i},
            )
            if state == "expired":
                Approval.objects.filter(operation=gated).update(expires_at=timezone.now())
        wait = factories.operation(owner, task, kind="wait_signal", tool="", signal=f"s{i}")
        Operation.objects.filter(pk=wait.pk).update(wait_until=timezone.now())
    wait_sweep()
    approval_expire_sweep()


PEOPLE_REQUESTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "GET /api/v1/approvals": lambda w: w["operator"].client().get("/api/v1/approvals"),
    "GET /api/v1/waits": lambda w: w["admin"].client().get("/api/v1/waits"),
    "page /approvals/": lambda w: w["browser"].get("/approvals/"),
    "fragment /fragments/approvals": lambda w: w["browser"].get("/fragments/approvals"),
    "page /waits/": lambda w: w["browser"].get("/waits/"),
    "fragment /fragments/waits": lambda w: w["browser"].get("/fragments/waits"),
}


def test_the_human_queues_do_not_grow_with_their_rows():
    """Measured with 2 requests of each kind, then again after 4 more: the same count."""
    from django.contrib.auth import get_user_model

    owner = factories.agent()
    task = factories.task(owner)
    operator = factories.console_user("operator")
    admin = factories.console_user("admin")
    browser = Client()
    browser.force_login(get_user_model().objects.get(pk=admin.actor.user_id))
    world = {"operator": operator, "admin": admin, "browser": browser}
    for principal in (operator, admin):
        assert principal.client().get("/api/v1/tasks").status_code == 200
    _gated_and_expired(owner, task, 2)
    small = {name: _queries(lambda r=r: r(world)) for name, r in PEOPLE_REQUESTS.items()}
    _gated_and_expired(owner, task, 4)
    large = {name: _queries(lambda r=r: r(world)) for name, r in PEOPLE_REQUESTS.items()}
    growing = {name: (small[name], large[name]) for name in small if small[name] != large[name]}
    assert not growing, f"queries (2 rows, 6 rows) grow with the rows: {growing}"
