"""Every list and detail endpoint and page costs a number of queries that does not grow with
the rows it shows (no N+1): measured with 2 rows and with 6, the counts are equal."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runtime.models import Invocation, Operation
from tests import factories

pytestmark = pytest.mark.django_db

_API = ("results", "")


def _queries(call: Callable[[], Any]) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = call()
    assert response.status_code == 200, getattr(response, "content", b"")[:300]
    return len(ctx.captured_queries)


def _world() -> dict[str, Any]:
    """An agent and its tasks, a support person and an admin; ``_grow`` adds the rows."""
    owner = factories.agent()
    admin = factories.console_user("admin")
    browser = Client()
    from django.contrib.auth import get_user_model

    browser.force_login(get_user_model().objects.get(pk=admin.actor.user_id))
    # First uses (a token's last-use touch, the brute-force counters' rows) are not per-row work.
    for principal in (owner, admin):
        assert principal.client().get("/api/v1/tasks").status_code == 200
    task = factories.task(owner, name="t0")
    world: dict[str, Any] = {"owner": owner, "task": task, "admin": admin, "browser": browser}
    world.update(tasks=[task.pk], ops=[], unresolved=[])
    return world


def _grow(world: dict[str, Any], rows: int) -> None:
    """Grow the world to ``rows`` tasks, the first of which has ``rows`` operations, each with
    an invocation, every other one unresolved. The admin's views see every row in the database,
    so the same world grows between the two measurements (two worlds would show the admin both
    in each)."""
    owner, task = world["owner"], world["task"]
    while len(world["tasks"]) < rows:
        world["tasks"].append(factories.task(owner, name=f"t{len(world['tasks'])}").pk)
    while len(world["ops"]) < rows:
        n = len(world["ops"])
        op = factories.operation(owner, task, params={"n": n})
        Invocation.objects.create(
            operation=op, number=1, lease_generation=1, started_at=op.created_at, outcome="lost"
        )
        if n % 2:
            Operation.objects.filter(pk=op.pk).update(status="unresolved")
            world["unresolved"].append(op.pk)
        world["ops"].append(op.pk)
    world["op"] = world["ops"][0]


def _ids(response: Any, key: str, attribute: str) -> set[str]:
    """The ids of the rows a response shows: a JSON list's items, or the page's rows marked
    ``data-task`` / ``data-operation``."""
    if response["Content-Type"].startswith("application/json"):
        body = response.json()
        items = body[key] if isinstance(body, dict) else body
        return {item["id"] if key != "events" else item["operation"] for item in items} - {None}
    return set(re.findall(rf'{attribute}="([^"]+)"', response.content.decode()))


# Each request, and which of the world's rows it must show (so that the two measurements read
# 2 rows and 6): (request, rows it shows, where they are in the response).
REQUESTS: dict[str, tuple[Callable[[dict[str, Any]], Any], str, str, str]] = {
    "GET /api/v1/tasks": (lambda w: w["owner"].client().get("/api/v1/tasks"), "tasks", *_API),
    "GET /api/v1/tasks/{id}": (
        lambda w: w["owner"].client().get(f"/api/v1/tasks/{w['task'].pk}"),
        "",
        *_API,
    ),
    "GET /api/v1/tasks/{id}/operations": (
        lambda w: w["owner"].client().get(f"/api/v1/tasks/{w['task'].pk}/operations"),
        "ops",
        *_API,
    ),
    "GET /api/v1/operations": (
        lambda w: w["owner"].client().get("/api/v1/operations"),
        "ops",
        *_API,
    ),
    "GET /api/v1/operations?status=unresolved": (
        lambda w: w["admin"].client().get("/api/v1/operations?status=unresolved"),
        "unresolved",
        *_API,
    ),
    "GET /api/v1/operations/{id}": (
        lambda w: w["owner"].client().get(f"/api/v1/operations/{w['op']}"),
        "",
        *_API,
    ),
    "GET /api/v1/tasks/{id}/events": (
        lambda w: w["owner"].client().get(f"/api/v1/tasks/{w['task'].pk}/events"),
        "ops",
        "events",
        "",
    ),
    "page /": (lambda w: w["browser"].get("/"), "tasks", "", "data-task"),
    "page /tasks/": (lambda w: w["browser"].get("/tasks/"), "tasks", "", "data-task"),
    "page /tasks/{id}/": (
        lambda w: w["browser"].get(f"/tasks/{w['task'].pk}/"),
        "ops",
        "",
        "data-operation",
    ),
    "fragment /tasks/{id}/live": (
        lambda w: w["browser"].get(f"/tasks/{w['task'].pk}/live"),
        "ops",
        "",
        "data-operation",
    ),
    "page /unresolved/": (
        lambda w: w["browser"].get("/unresolved/"),
        "unresolved",
        "",
        "data-operation",
    ),
}


def _measure(world: dict[str, Any]) -> dict[str, int]:
    """Each request's query count, having checked that it shows exactly the world's rows."""
    counts, wrong = {}, {}
    for name, (request, rows, key, attribute) in sorted(REQUESTS.items()):
        with CaptureQueriesContext(connection) as ctx:
            response = request(world)
        assert response.status_code == 200, (name, response.content[:300])
        counts[name] = len(ctx.captured_queries)
        if rows:
            shown = _ids(response, key, attribute)
            if shown != set(world[rows]):
                wrong[name] = f"{len(shown)} rows, not the {len(world[rows])} {rows}"
    assert not wrong, f"the requests do not show the rows measured: {wrong}"
    return counts


def test_queries_do_not_grow_with_rows():
    world = _world()
    _grow(world, 2)
    small = _measure(world)
    _grow(world, 6)
    assert (len(world["tasks"]), len(world["ops"]), len(world["unresolved"])) == (6, 6, 3)
    large = _measure(world)
    growing = {name: (small[name], large[name]) for name in small if small[name] != large[name]}
    assert not growing, f"queries (2 rows, 6 rows) grow with the rows: {growing}"


def _gated_and_expired(owner, task, n: int) -> None:
    """``n`` pending approval requests, ``n`` expired ones and ``n`` expired signal waits."""
    from django.utils import timezone

    from runtime.approval_expiry import approval_expire_sweep
    from runtime.models import Approval, Resolution
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
        # The histories' rows: a resolution of an operation (read with its operation and task).
        Resolution.objects.create(
            operation=wait,
            actor="user:support",
            resolution="no_effect",
            evidence=f"checked {i}",
            from_status="unresolved",
            to_status="failed",
            state_version=1,
            at=timezone.now(),
        )
    wait_sweep()
    approval_expire_sweep()


PEOPLE_REQUESTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "GET /api/v1/approvals": lambda w: w["operator"].client().get("/api/v1/approvals"),
    "GET /api/v1/waits": lambda w: w["admin"].client().get("/api/v1/waits"),
    "page /approvals/": lambda w: w["browser"].get("/approvals/"),
    "fragment /fragments/approvals": lambda w: w["browser"].get("/fragments/approvals"),
    "page /approvals/?status=decided": lambda w: w["browser"].get("/approvals/?status=decided"),
    "page /unresolved/?status=resolved": lambda w: w["browser"].get("/unresolved/?status=resolved"),
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
    # The histories show the rows measured: the expired requests and the resolutions.
    for path, attribute in (
        ("/approvals/?status=decided", "data-decided-approval"),
        ("/unresolved/?status=resolved", "data-resolved-operation"),
    ):
        assert browser.get(path).content.decode().count(f'{attribute}="') == 6, path
    growing = {name: (small[name], large[name]) for name in small if small[name] != large[name]}
    assert not growing, f"queries (2 rows, 6 rows) grow with the rows: {growing}"
