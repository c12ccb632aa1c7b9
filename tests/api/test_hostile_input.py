"""The hostile input set: every write endpoint of the API against huge, deeply nested, NUL,
invalid UTF-8, duplicate-key, wrong-type and out-of-range bodies, and path tricks in ids and
names; every answer is a 4xx in the contract's error format and nothing changes (rows, versions,
idempotency records). Markup in every field the console renders is checked in Chromium in
tests/browser/test_hostile_markup.py; errors provoked below the application (the HTTP server's
own) in tests/api/test_http_server.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from runtime.models import Event, IdempotentRequest, Invocation, Operation, Task
from tests import factories
from tests.api.support import assert_error, post_raw, raw_http, request_bytes

pytestmark = pytest.mark.postgres

ENDPOINTS = [
    "/api/v1/tasks",
    "/api/v1/tasks/{task}/operations",
    "/api/v1/tasks/{task}/cancel",
    "/api/v1/tasks/{task}/fail",
    "/api/v1/operations/{op}/claim",
    "/api/v1/operations/{op}/heartbeat",
    "/api/v1/operations/{op}/complete",
    "/api/v1/operations/{op}/resolve",
]


def _nest(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# Each body is hostile for every endpoint, whatever fields that endpoint reads.
BODIES: dict[str, bytes] = {
    "nul-in-value": b'{"name": "a\\u0000", "reason": "\\u0000", "step": "\\u0000", '
    b'"tool": "demo.echo", "lease_generation": 1, "outcome": "\\u0000", '
    b'"resolution": "\\u0000", "state_version": 1}',
    "nul-in-key": b'{"\\u0000": 1, "name": "x\\u0000"}',
    "raw-nul-byte": b'{"name": "a\x00b"}',
    "invalid-utf8": b'{"name": "\xff\xfe\xfd", "reason": "\xc3\x28"}',
    "lone-surrogate": b'{"name": "\\udc00", "reason": "\\ud800"}',
    "overlong-utf8": b'{"name": "\xc0\xaf"}',
    "deep-nesting": ('{"input": ' + _nest(100_000) + "}").encode(),
    "nesting-past-limit": ('{"input": ' + _nest(70) + ', "params": ' + _nest(70) + "}").encode(),
    "duplicate-keys": b'{"name": "a", "name": "b", "reason": "a", "reason": "b", '
    b'"lease_generation": 1, "lease_generation": 2}',
    "not-an-object": b'[{"name": "x"}]',
    "truncated": b'{"name": "x", "input": {',
    "nan": b'{"name": "x", "lease_generation": NaN, "reason": NaN}',
    "infinity": b'{"name": "x", "input": {"v": 1e999}, "reason": 1e999}',
}

# Wrong types and out-of-range numbers, per endpoint (each must be a 400 on its own).
FIELD_ATTACKS: dict[str, list[dict]] = {
    "/api/v1/tasks": [
        {"name": 5},
        {"name": ["x"]},
        {"name": True},
        {"name": "x", "input": "text"},
        {"name": "x", "input": [1]},
        {"name": "x", "deadline_seconds": "10"},
        {"name": "x", "deadline_seconds": 2**31},
        {"name": "x", "deadline_seconds": -1},
        {"name": "x", "deadline_seconds": 0},
        {"name": "x", "deadline_seconds": 1.5e308},
        {"name": "x", "compensate_on": ["everything"]},
        {"name": "x" * 100_000},
        {"name": "../../etc/passwd" + "/" * 400},
    ],
    "/api/v1/tasks/{task}/operations": [
        {"tool": "demo.echo", "step": 1},
        {"tool": "demo.echo", "step": "s", "params": "x"},
        {"tool": "demo.echo", "step": "s", "params": [1, 2]},
        {"tool": "demo.echo", "step": "s", "intent_version": True},
        {"tool": "demo.echo", "step": "s", "intent_version": 2**40},
        {"tool": "demo.echo", "step": "s", "intent_version": 0},
        {"tool": "demo.echo", "step": "s", "max_attempts": 10**20},
        {"tool": "demo.echo", "step": "s", "executor": "root"},
        {"tool": "demo.echo", "step": "s", "kind": "shell"},
        {"tool": "../../demo.echo", "step": "s"},
        {"tool": "demo.echo\u202e", "step": "s"},
        {"tool": "demo.echo", "step": "s" * 201},
        {"tool": "demo.echo", "step": "s", "idempotency_key": "k" * 301},
        {"tool": "demo.echo", "step": "s", "idempotency_key": 7},
    ],
    "/api/v1/tasks/{task}/cancel": [{"reason": 5}, {"reason": "r" * 2001}, {"reason": None}],
    "/api/v1/tasks/{task}/fail": [{"reason": ["x"]}, {"reason": "r" * 2001}],
    "/api/v1/operations/{op}/heartbeat": [
        {"lease_generation": -1},
        {"lease_generation": 2**31},
        {"lease_generation": "1"},
        {"lease_generation": 1.5},
        {"lease_generation": None},
    ],
    "/api/v1/operations/{op}/complete": [
        {"lease_generation": 1, "outcome": "succeeded", "error": "x"},
        {"lease_generation": 1, "outcome": ["succeeded"]},
        {"lease_generation": 1, "outcome": "failed", "error": {"kind": "odd"}},
        {"lease_generation": 1, "outcome": "succeeded", "usage": {"tokens": -5}},
        {"lease_generation": 1, "outcome": "succeeded", "usage": {"tokens": "many"}},
        {"lease_generation": 10**30, "outcome": "succeeded"},
    ],
    "/api/v1/operations/{op}/resolve": [
        {"resolution": "delete_everything", "state_version": 1},
        {"resolution": "no_effect", "state_version": "1"},
        {"resolution": "no_effect", "state_version": 2**31},
        {"resolution": "no_effect", "state_version": 0},
        {"resolution": "no_effect", "state_version": 1, "evidence": "e" * 10_001},
    ],
}


@pytest.fixture(autouse=True)
def fast_passwords(settings) -> None:
    # Hundreds of console users are made here; the real hasher's cost is not under test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world(db) -> Iterator[dict]:
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, executor="agent")
    assert owner.client().post(f"/api/v1/operations/{op.pk}/claim").status_code == 200
    yield {"owner": owner, "admin": factories.console_user("admin"), "task": task, "op": op}


def _state() -> tuple:
    return (
        sorted(Task.objects.values_list("pk", "state_version", "cancellation", "outcome")),
        sorted(Operation.objects.values_list("pk", "state_version", "status", "lease_generation")),
        Event.objects.count(),
        Invocation.objects.count(),
        IdempotentRequest.objects.count(),
    )


def _url(path: str, world: dict) -> str:
    return path.format(task=world["task"].pk, op=world["op"].pk)


def _client(path: str, world: dict):
    console = path.endswith(("/cancel", "/fail", "/resolve"))
    return (world["admin"] if console else world["owner"]).client()


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("name", list(BODIES))
def test_every_write_endpoint_refuses_every_hostile_body(world, path, name):
    before = _state()
    client = _client(path, world)
    url = _url(path, world)
    assert_error(post_raw(client, url, BODIES[name]), 400)
    assert_error(post_raw(client, url, BODIES[name], HTTP_IDEMPOTENCY_KEY=f"h-{name}"), 400)
    assert _state() == before


@pytest.mark.parametrize(
    ("path", "body"),
    [(path, body) for path, bodies in FIELD_ATTACKS.items() for body in bodies],
    ids=[f"{p.rsplit('/', 1)[-1]}-{i}" for p, bs in FIELD_ATTACKS.items() for i in range(len(bs))],
)
def test_wrong_types_and_out_of_range_numbers_are_400(world, path, body):
    before = _state()
    response = post_raw(_client(path, world), _url(path, world), json.dumps(body))
    assert_error(response, 400)
    assert _state() == before


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_body_over_the_upload_limit_is_413(world, path, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    before = _state()
    body = json.dumps({"name": "x", "reason": "r", "input": {"blob": "y" * 100_000}})
    assert_error(post_raw(_client(path, world), _url(path, world), body), 413)
    assert _state() == before


ID_TRICKS = [
    "%2e%2e",
    "..%2F..%2Fetc%2Fpasswd",
    "%00",
    "tsk_x%00y",
    "x" * 65,
    "%C0%AE%C0%AE",
    "%E2%80%AE",
    "tsk_x;rm",
    "tsk_x%20",
    "%25",
]


@pytest.mark.parametrize("trick", ID_TRICKS)
@pytest.mark.parametrize("path", ENDPOINTS[1:])
def test_path_tricks_in_ids_are_404(world, path, trick):
    before = _state()
    url = path.format(task=trick, op=trick)
    response = _client(path, world).post(url, data=b"{}", content_type="application/json")
    assert_error(response, 404, "not_found")
    assert _state() == before


@pytest.mark.parametrize("trick", ["..%2F..", "payments%00", "payments%2F..", "x" * 65])
def test_path_tricks_in_receiver_names_are_404(world, trick):
    client = world["owner"].client()
    response = client.get(f"/api/v1/demo/receivers/{trick}/effects", {"key": "k"})
    assert response.status_code in (400, 404)
    assert_error(response, response.status_code)


def test_path_tricks_in_names_are_only_text(world):
    name = "../../../etc/passwd%00<>"
    response = (
        world["owner"]
        .client()
        .post("/api/v1/tasks", data=json.dumps({"name": name}), content_type="application/json")
    )
    assert response.status_code == 201
    assert Task.objects.get(pk=response.json()["id"]).name == name


@pytest.mark.parametrize("name", ["invalid-utf8", "raw-nul-byte", "duplicate-keys", "deep-nesting"])
def test_the_same_over_a_real_socket(server, name):
    owner = factories.agent()
    data = request_bytes(
        "POST",
        "/api/v1/tasks",
        BODIES[name],
        {"Authorization": f"Bearer {owner.token}", "Content-Type": "application/json"},
    )
    status, _, headers, body = raw_http(server.url, data)
    assert status == 400 and headers["content-type"] == "application/json"
    assert set(json.loads(body)) == {"error"}
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "query",
    [
        "q=%FF%FE",
        "q=%00",
        "condition=%00",
        "limit=99999999999999999999",
        "cursor=%00",
        "q=" + "x" * 301,
    ],
)
def test_hostile_queries_are_400(world, query):
    response = world["owner"].client().get(f"/api/v1/tasks?{query}")
    if query.startswith("q=%FF"):
        # Undecodable bytes are replaced by Django, leaving harmless text: a search.
        assert response.status_code == 200
    else:
        assert_error(response, 400)
