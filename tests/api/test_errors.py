"""Malformed input is a 400 in the error format with nothing created, and hostile paths, queries
and bodies never reach the database as a 500."""

from __future__ import annotations

import base64

import pytest

from runtime.models import Event, IdempotentRequest, Operation, Task
from tests import factories
from tests.api.support import assert_error, post_json, post_raw

pytestmark = pytest.mark.postgres


def _nothing_created() -> None:
    assert not Task.objects.exists()
    assert not IdempotentRequest.objects.exists()


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "",
        '{"name": "x"',
        '{"name": NaN}',
        '{"name": "x", "input": {"big": Infinity}}',
        '{"name": "x", "input": {"big": 1e400}}',
        '{"name": "nul\\u0000here"}',
        '{"name": "x", "input": {"k\\u0000": 1}}',
        '{"name": "x", "input": {"v": ["\\u0000"]}}',
        '{"name": "lone \\ud800 surrogate"}',
        '{"name": "x", "input": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"name": "x", "input": ' + '{"a":' * 100 + "1" + "}" * 100 + "}",
    ],
    ids=[
        "truncated",
        "empty",
        "unclosed",
        "nan",
        "infinity",
        "overflowing-number",
        "nul-in-string",
        "nul-in-key",
        "nul-in-list",
        "lone-surrogate",
        "deep-nesting",
        "nesting-past-limit",
    ],
)
def test_an_unparseable_or_unstorable_body_is_400(db, raw):
    client = factories.agent().client()
    assert_error(post_raw(client, "/api/v1/tasks", raw), 400)
    assert_error(post_raw(client, "/api/v1/tasks", raw, HTTP_IDEMPOTENCY_KEY="k"), 400)
    _nothing_created()


def test_moderate_nesting_and_big_integers_are_fine(db):
    client = factories.agent().client()
    deep = {"a": 1}
    for _ in range(30):
        deep = {"a": deep}
    response = post_json(client, "/api/v1/tasks", {"name": "x", "input": {"d": deep, "n": 10**30}})
    assert response.status_code == 201, response.content
    assert Task.objects.get().input["n"] == 10**30


@pytest.mark.parametrize("raw", ["[]", '[{"name": "x"}]', '"name"', "42", "null", "true"])
def test_a_body_that_is_not_an_object_is_400(db, raw):
    client = factories.agent().client()
    assert_error(post_raw(client, "/api/v1/tasks", raw), 400, "invalid_input")
    _nothing_created()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": 5},
        {"name": 5.5},
        {"name": True},
        {"name": None},
        {"name": ["x"]},
        {"name": {"x": 1}},
        {"name": ""},
        {"name": "   "},
        {"name": "x" * 301},
        {"name": "x", "input": "x"},
        {"name": "x", "input": [1]},
        {"name": "x", "deadline_seconds": -1},
        {"name": "x", "deadline_seconds": 0},
        {"name": "x", "deadline_seconds": "60"},
        {"name": "x", "deadline_seconds": 1.5},
        {"name": "x", "deadline_seconds": True},
        {"name": "x", "deadline_seconds": 10**12},
    ],
)
def test_wrong_types_and_values_for_a_task_are_400(db, body):
    client = factories.agent().client()
    assert_error(post_json(client, "/api/v1/tasks", body), 400, "invalid_input")
    _nothing_created()


@pytest.mark.parametrize(
    "body",
    [
        {"tool": "demo.echo"},
        {"tool": "demo.echo", "step": 7},
        {"tool": "demo.echo", "step": ""},
        {"tool": 1, "step": "s"},
        {"tool": "demo.echo", "step": "s", "params": "x"},
        {"tool": "demo.echo", "step": "s", "params": [1, 2]},
        {"tool": "demo.echo", "step": "s", "max_attempts": 0},
        {"tool": "demo.echo", "step": "s", "max_attempts": 101},
        {"tool": "demo.echo", "step": "s", "max_attempts": "3"},
        {"tool": "demo.echo", "step": "s", "intent_version": 0},
        {"tool": "demo.echo", "step": "s", "intent_version": 2**31},
        {"tool": "demo.echo", "step": "s", "timeout_seconds": 10**20},
        {"tool": "demo.echo", "step": "s", "idempotency_key": ""},
        {"tool": "demo.echo", "step": "s", "idempotency_key": 12},
        {"tool": "demo.echo", "step": "s", "kind": "magic"},
        {"tool": "demo.echo", "step": "s", "executor": "robot"},
        {"tool": "demo.echo", "step": "s", "estimate": {"cost_cents": -1}},
        {"tool": "demo.echo", "step": "s", "estimate": "cheap"},
        {"tool": "", "step": "s"},
    ],
)
def test_wrong_types_and_values_for_an_operation_are_400(db, body):
    alice = factories.agent()
    task = factories.task(alice)
    events = Event.objects.filter(task=task).count()
    response = post_json(alice.client(), f"/api/v1/tasks/{task.pk}/operations", body)
    assert_error(response, 400)
    assert not Operation.objects.exists()
    assert Event.objects.filter(task=task).count() == events


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("heartbeat", {"lease_generation": 10**20}),
        ("heartbeat", {"lease_generation": "1"}),
        ("heartbeat", {}),
        ("complete", {"lease_generation": 10**20, "outcome": "succeeded"}),
        ("complete", {"lease_generation": 1, "outcome": "great"}),
        ("complete", {"lease_generation": 1, "outcome": "failed"}),
        ("complete", {"lease_generation": 1, "outcome": "failed", "error": {"kind": "odd"}}),
    ],
)
def test_malformed_agent_reports_are_400_and_change_nothing(db, path, body):
    alice = factories.agent()
    op = factories.operation(alice, factories.task(alice), executor="agent")
    client = alice.client()
    assert client.post(f"/api/v1/operations/{op.pk}/claim").status_code == 200
    before = Operation.objects.get(pk=op.pk)
    assert_error(post_json(client, f"/api/v1/operations/{op.pk}/{path}", body), 400)
    after = Operation.objects.get(pk=op.pk)
    assert (after.status, after.state_version) == (before.status, before.state_version)


def _cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "query",
    [
        {"cursor": "!!!"},
        {"cursor": "bm90IGEgY3Vyc29y"},
        {"cursor": _cursor("2025-01-01T00:00:00|tsk_x")},
        {"cursor": _cursor("2025-01-01T00:00:00+00:00|tsk\x00x")},
        {"cursor": _cursor("yesterday|tsk_x")},
        {"cursor": "\x00"},
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "201"},
        {"limit": "ten"},
        {"limit": "1e2"},
        {"limit": "9" * 40},
        {"q": "a\x00b"},
        {"condition": "\x00"},
    ],
)
def test_bad_list_parameters_are_400(db, query):
    client = factories.agent().client()
    assert_error(client.get("/api/v1/tasks", query), 400, "invalid_input")


@pytest.mark.parametrize(
    "query", [{"cursor": "@@"}, {"task": "tsk\x00"}, {"status": "\x00"}, {"limit": "0"}]
)
def test_bad_operation_list_parameters_are_400(db, query):
    client = factories.agent().client()
    assert_error(client.get("/api/v1/operations", query), 400, "invalid_input")


def test_a_cursor_from_one_list_is_just_a_position_in_another(db):
    # Cursors are opaque but not secrets: a well-formed one from elsewhere is a position, not
    # a way into someone else's rows.
    alice, bob = factories.agent(), factories.agent()
    for i in range(3):
        factories.task(alice, f"a{i}")
        factories.task(bob, f"b{i}")
    page = bob.client().get("/api/v1/tasks", {"limit": "1"}).json()
    body = alice.client().get("/api/v1/tasks", {"cursor": page["next"]}).json()
    assert {t["name"][0] for t in body["results"]} <= {"a"}


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tasks/%00",
        "/api/v1/tasks/%00/events",
        "/api/v1/tasks/%00/operations",
        "/api/v1/operations/%00",
        "/api/v1/tasks/" + "x" * 5000,
        "/api/v1/operations/" + "op_" + "y" * 300,
        "/api/v1/tasks/%ED%A0%80",
        "/api/v1/tasks/%FF%FE",
        "/api/v1/tasks/..%2F..%2Fetc%2Fpasswd",
        "/api/v1/tasks/'%20OR%201=1--",
        "/api/v1/nowhere",
    ],
)
def test_hostile_paths_are_a_404_in_the_error_format(db, path):
    client = factories.agent().client()
    assert_error(client.get(path), 404, "not_found")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tasks/%00/operations",
        "/api/v1/operations/%00/claim",
        "/api/v1/operations/" + "z" * 5000 + "/complete",
    ],
)
def test_hostile_paths_on_post_are_a_404(db, path):
    client = factories.agent().client()
    assert_error(post_json(client, path, {"tool": "demo.echo", "step": "s"}), 404, "not_found")
    assert not Operation.objects.exists()


def test_an_unknown_method_is_405_in_the_error_format(db):
    client = factories.agent().client()
    assert_error(client.delete("/api/v1/tasks"), 405, "method_not_allowed")
    assert_error(client.put("/api/v1/tasks", {}, format="json"), 405, "method_not_allowed")


def test_an_unsupported_body_type_is_415(db):
    client = factories.agent().client()
    response = client.post("/api/v1/tasks", data="name=x", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")
    _nothing_created()


def test_a_body_over_the_upload_limit_is_413_in_the_error_format(db, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    client = factories.agent().client()
    big = {"name": "x", "input": {"blob": "y" * 20_000}}
    assert_error(post_json(client, "/api/v1/tasks", big), 413, "request_too_large")
    assert_error(
        post_json(client, "/api/v1/tasks", big, HTTP_IDEMPOTENCY_KEY="big"),
        413,
        "request_too_large",
    )
    _nothing_created()


@pytest.mark.parametrize(
    "raw", ["name=a%00b", "name=a&input.x=%00", "name=a&input.k%00=1"], ids=["name", "value", "key"]
)
def test_a_form_body_is_415_whatever_it_holds(db, raw):
    client = factories.agent().client()
    response = client.post(
        "/api/v1/tasks", data=raw, content_type="application/x-www-form-urlencoded"
    )
    assert_error(response, 415, "unsupported_media_type")
    _nothing_created()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tasks",
        "/api/v1/tasks/{task}/operations",
        "/api/v1/tasks/{task}/cancel",
        "/api/v1/tasks/{task}/fail",
        "/api/v1/operations/{op}/claim",
        "/api/v1/operations/{op}/heartbeat",
        "/api/v1/operations/{op}/complete",
        "/api/v1/operations/{op}/resolve",
    ],
)
@pytest.mark.parametrize(
    "raw",
    ["[" * 5000 + "]" * 5000, '{"reason": "\\u0000", "params": {"a": 1e999}}'],
    ids=["deep", "unstorable"],
)
def test_every_post_parses_bodies_the_same_way(db, path, raw):
    admin = factories.console_user("admin")
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, executor="agent")
    events = Event.objects.count()
    url = path.format(task=task.pk, op=op.pk)
    assert_error(post_raw(admin.client(), url, raw, HTTP_IDEMPOTENCY_KEY="k"), 400)
    assert Event.objects.count() == events
    assert not IdempotentRequest.objects.exists()
