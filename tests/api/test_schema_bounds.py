"""The schema's numeric bounds are the server's: every maximum /api/schema/ states for a request
(body fields, each shape of a oneOf, per-meter amounts, query parameters) is walked, and the
server takes the maximum and answers max+1 with 400 naming the field. Amounts that land in
bigint columns inside a tool's parameters are refused at proposal too, not in the worker."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from runtime.budgets import MAX_AMOUNT
from runtime.models import Operation
from runtime.sandbox import receivers
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

_n = itertools.count()


@pytest.fixture
def schema(db) -> dict:
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return dict(response.json())


def _component(schema: dict, ref: str) -> dict:
    return dict(schema["components"]["schemas"][ref.rsplit("/", 1)[1]])


def _bounded(schema: dict, node: dict, where: tuple[str, ...]) -> Iterator[tuple]:
    """(field path, maximum, type) of every bounded number under ``node``, through references,
    oneOf shapes (each shape's index is part of the path), objects, maps and arrays."""
    if "$ref" in node:
        yield from _bounded(schema, _component(schema, node["$ref"]), where)
        return
    for key in ("allOf", "anyOf"):
        for part in node.get(key, []):
            yield from _bounded(schema, part, where)
    for i, shape in enumerate(node.get("oneOf", [])):
        yield from _bounded(schema, shape, (*where, f"<shape {i}>"))
    if "maximum" in node:
        yield where, node["maximum"], node["type"]
    for name, prop in node.get("properties", {}).items():
        yield from _bounded(schema, prop, (*where, name))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _bounded(schema, extra, (*where, "*"))
    if "items" in node:
        yield from _bounded(schema, node["items"], (*where, "[]"))


class World:
    """Fresh objects for each request, so that one value's answer never depends on another's."""

    def __init__(self) -> None:
        self.agent = factories.agent()
        self.admin = factories.console_user("admin")
        self.support = factories.console_user("support")
        self.task = factories.task(self.agent, "bounds")

    def client(self, principal: Any) -> APIClient:
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {principal.token}")
        return c

    def step(self) -> str:
        return f"step-{next(_n)}"

    def claimed(self) -> tuple[Operation, dict]:
        task = factories.task(self.agent, "usage", budget={"cost_cents": 1000})
        op = factories.operation(self.agent, task, executor="agent")
        lease = self.client(self.agent).post(f"/api/v1/operations/{op.pk}/claim", format="json")
        assert lease.status_code == 200, lease.content
        return op, lease.json()

    def gated(self) -> Operation:
        params = {"account": "a", "amount_cents": 25000}
        return factories.operation(
            self.agent, self.task, tool="demo.payments.charge", params=params
        )


# For each route: who calls, and a fresh (url, valid body) for one request; the walked field is
# set on that body. A field the schema bounds on a route missing here fails the test.
Sender = Callable[[World], tuple[Any, str, dict]]


def _operations(shape: int) -> Sender:
    def send(w: World) -> tuple[Any, str, dict]:
        bodies = [
            {"tool": "demo.echo", "step": w.step()},
            {"kind": "wait_signal", "step": w.step(), "signal": "go"},
            {"kind": "timer", "step": w.step(), "timeout_seconds": 60},
        ]
        return w.agent, f"/api/v1/tasks/{w.task.pk}/operations", bodies[shape]

    return send


def _complete(w: World) -> tuple[Any, str, dict]:
    op, lease = w.claimed()
    body = {
        "lease_generation": lease["lease_generation"],
        "lease_token": lease["lease_token"],
        "outcome": "succeeded",
    }
    return w.agent, f"/api/v1/operations/{op.pk}/complete", body


def _heartbeat(w: World) -> tuple[Any, str, dict]:
    op, lease = w.claimed()
    body = {"lease_generation": lease["lease_generation"], "lease_token": lease["lease_token"]}
    return w.agent, f"/api/v1/operations/{op.pk}/heartbeat", body


def _accept(w: World) -> tuple[Any, str, dict]:
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = w.client(w.agent).post(
        f"/api/v1/tasks/{w.task.pk}/artifacts",
        {"file": SimpleUploadedFile("a.txt", b"x", "text/plain"), "name": f"a{next(_n)}.txt"},
        format="multipart",
    )
    assert upload.status_code == 201, upload.content
    body = {"expected_state_version": 1}
    return w.agent, f"/api/v1/artifacts/{upload.json()['id']}/accept", body


SENDERS: dict[tuple[str, str], Sender] = {
    ("/api/v1/tasks", ""): lambda w: (w.agent, "/api/v1/tasks", {"name": "t"}),
    **{("/api/v1/tasks/{task_id}/operations", f"<shape {i}>"): _operations(i) for i in range(3)},
    ("/api/v1/operations/{operation_id}/complete", ""): _complete,
    ("/api/v1/operations/{operation_id}/heartbeat", ""): _heartbeat,
    ("/api/v1/operations/{operation_id}/resolve", ""): lambda w: (
        w.support,
        f"/api/v1/operations/{factories.operation(w.agent, w.task).pk}/resolve",
        {"resolution": "no_effect", "evidence": "checked"},
    ),
    ("/api/v1/approvals/{approval_id}/renew", ""): lambda w: (
        w.admin,
        f"/api/v1/approvals/{w.gated().approvals.get().pk}/renew",
        {"reason": "more time"},
    ),
    ("/api/v1/waits/{operation_id}/renew", ""): lambda w: (
        w.admin,
        "/api/v1/waits/{}/renew".format(
            factories.operation(w.agent, w.task, kind="wait_signal", tool="", signal="go").pk
        ),
        {"reason": "more time"},
    ),
    ("/api/v1/artifacts/{artifact_id}/accept", ""): _accept,
    ("/api/v1/schedules", ""): lambda w: (
        w.agent,
        "/api/v1/schedules",
        {"interval_seconds": 3600, "task": {"name": "nightly"}},
    ),
    ("/api/v1/tools/declared", ""): lambda w: (
        w.admin,
        "/api/v1/tools/declared",
        {
            "name": f"acme.bounds.{w.step()}",
            "kind": "http",
            "contract": "replay",
            "url": "https://crm.example.com/contacts",
            "approval": {"required": "always"},
        },
    ),
}
# Query parameters: the url of a list the caller may read.
LISTS = {
    "/api/v1/tasks": lambda w: (w.agent, "/api/v1/tasks"),
    "/api/v1/operations": lambda w: (w.agent, "/api/v1/operations"),
    "/api/v1/approvals": lambda w: (w.admin, "/api/v1/approvals"),
    "/api/v1/waits": lambda w: (w.admin, "/api/v1/waits"),
    "/api/v1/tasks/{task_id}/events": lambda w: (w.agent, f"/api/v1/tasks/{w.task.pk}/events"),
    "/api/v1/tasks/{task_id}/operations": lambda w: (
        w.agent,
        f"/api/v1/tasks/{w.task.pk}/operations",
    ),
    "/api/v1/schedules": lambda w: (w.agent, "/api/v1/schedules"),
}


def _set(body: dict, field: tuple[str, ...], value: Any) -> dict:
    """``body`` with ``value`` at ``field`` (a map's entry is a builtin meter)."""
    target = body
    for part in field[:-1]:
        key = "cost_cents" if part == "*" else part
        target = target.setdefault(key, {})
    target["cost_cents" if field[-1] == "*" else field[-1]] = value
    return body


def _post(w: World, sender: Sender, field: tuple[str, ...], value: Any):
    principal, url, body = sender(w)
    return w.client(principal).post(url, _set(body, field, value), format="json")


def test_every_body_maximum_is_the_servers(schema):
    w = World()
    walked = []
    for path, item in schema["paths"].items():
        post = item.get("post", {})
        content = post.get("requestBody", {}).get("content", {})
        if "application/json" not in content:
            continue
        for where, maximum, kind in _bounded(schema, content["application/json"]["schema"], ()):
            shape = where[0] if where[0].startswith("<shape") else ""
            field = where[1:] if shape else where
            sender = SENDERS.get((path, shape))
            assert sender is not None, f"no sender for {path} {shape}: add one for {field}"
            above = maximum + 1
            if kind == "number":
                assert float(above) != float(maximum), (path, field)  # exact as a double
            at_max = _post(w, sender, field, maximum)
            assert at_max.status_code != 400, (path, shape, field, maximum, at_max.json())
            refused = _post(w, sender, field, above)
            assert refused.status_code == 400, (path, shape, field, above, refused.content)
            assert field[0] in refused.json()["error"]["message"], refused.json()
            walked.append((path, shape, field))
    # The fields this contract promises to bound are among those walked.
    fields = {(p, f[0]) for p, _, f in walked}
    for expected in [
        ("/api/v1/tasks", "deadline_seconds"),
        ("/api/v1/tasks", "budget"),
        ("/api/v1/tasks/{task_id}/operations", "max_attempts"),
        ("/api/v1/tasks/{task_id}/operations", "timeout_seconds"),
        ("/api/v1/tasks/{task_id}/operations", "approval_timeout_seconds"),
        ("/api/v1/tasks/{task_id}/operations", "estimate"),
        ("/api/v1/operations/{operation_id}/complete", "usage"),
        ("/api/v1/approvals/{approval_id}/renew", "expires_in_seconds"),
        ("/api/v1/waits/{operation_id}/renew", "expires_in_seconds"),
        ("/api/v1/schedules", "interval_seconds"),
        ("/api/v1/schedules", "catch_up_seconds"),
    ]:
        assert expected in fields, expected


def test_the_largest_amounts_are_taken_for_real(schema):
    """At the maximum, the amounts reach their bigint columns: a budget's limit, an estimate's
    hold and a report's usage (posted beyond the limit: money spent is recorded)."""
    w = World()
    client = w.client(w.agent)
    created = client.post(
        "/api/v1/tasks", {"name": "rich", "budget": {"cost_cents": MAX_AMOUNT}}, format="json"
    )
    assert created.status_code == 201, created.content
    task_id = created.json()["id"]
    proposed = client.post(
        f"/api/v1/tasks/{task_id}/operations",
        {"tool": "demo.echo", "step": "s", "executor": "agent", "estimate": {"cost_cents": 10}},
        format="json",
    )
    assert proposed.status_code == 201, proposed.content
    op_id = proposed.json()["id"]
    lease = client.post(f"/api/v1/operations/{op_id}/claim", format="json").json()
    done = client.post(
        f"/api/v1/operations/{op_id}/complete",
        {
            "lease_generation": lease["lease_generation"],
            "lease_token": lease["lease_token"],
            "outcome": "succeeded",
            "usage": {"cost_cents": MAX_AMOUNT},
        },
        format="json",
    )
    assert done.status_code == 200, done.content
    meter = client.get(f"/api/v1/tasks/{task_id}/budget").json()["meters"]["cost_cents"]
    assert (meter["limit"], meter["posted"]) == (MAX_AMOUNT, MAX_AMOUNT)


def test_every_query_maximum_is_the_servers(schema):
    w = World()
    walked = set()
    for path, item in schema["paths"].items():
        for param in item.get("get", {}).get("parameters", []):
            maximum = param.get("schema", {}).get("maximum")
            if maximum is None:
                continue
            assert path in LISTS, f"no list url for {path} {param['name']}"
            principal, url = LISTS[path](w)
            client = w.client(principal)
            at_max = client.get(url, {param["name"]: maximum})
            assert at_max.status_code == 200, (path, param["name"], at_max.content)
            refused = client.get(url, {param["name"]: maximum + 1})
            assert refused.status_code == 400, (path, param["name"], refused.content)
            walked.add(path)
    assert walked == set(LISTS)


@pytest.mark.parametrize(
    ("tool", "params", "field"),
    [
        ("demo.payments.charge", {"account": "a", "amount_cents": 10**23}, "params.amount_cents"),
        (
            "demo.payments.charge",
            {"account": "a", "amount_cents": MAX_AMOUNT + 1},
            "params.amount_cents",
        ),
        ("demo.inventory.reserve", {"sku": "s", "qty": 2**31}, "params.qty"),
        ("demo.echo", {"_usage": {"cost_cents": 10**23}}, "params._usage.cost_cents"),
    ],
)
def test_a_tool_amount_beyond_its_column_is_refused_at_proposal(tool, params, field):
    w = World()
    response = w.client(w.agent).post(
        f"/api/v1/tasks/{w.task.pk}/operations",
        {"tool": tool, "step": w.step(), "params": params},
        format="json",
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and field in error["message"], error
    assert not Operation.objects.filter(task=w.task, tool=tool).exists()


def test_the_largest_charge_is_proposed_and_stored_by_the_receiver():
    w = World()
    response = w.client(w.agent).post(
        f"/api/v1/tasks/{w.task.pk}/operations",
        {
            "tool": "demo.payments.charge",
            "step": "big",
            "params": {"account": "a", "amount_cents": MAX_AMOUNT},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "waiting_approval"
    # What the worker would do once approved: the receiver keeps it in its bigint column.
    stored = receivers.payments_charge(
        key="k-max", body={"account": "a", "amount_cents": MAX_AMOUNT}, fencing_token=1
    )
    assert stored.ok, stored.body
    assert stored.body["amount_cents"] == MAX_AMOUNT
