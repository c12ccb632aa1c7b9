"""Every route of docs/openapi.yaml, driven to an answer it documents, its body validated against
the schema of that status (issue 38: "every route's responses, on both the one-statement and the
general path, validated against docs/openapi.yaml"). The journey runs twice, with the
one-statement forms on (``HOTPATH``, runtime.dialect) and off (the general writer).

Schemathesis (tests/api/test_schemathesis.py) fuzzes each route with generated input, which
mostly earns 4xx answers; here each route is called as a user would, so its success body (and
both of a get-or-create's 200 and 201) is what gets checked. ``ROUTES`` is the table route ->
how it is called, in the order the calls build on each other; ``UNEXERCISED`` lists what cannot
be called here, with why. The validator is schemathesis' (status documented, content type,
body against the documented schema), on the file itself rather than the served /api/schema/.

In-process through the WSGI app inside the test's transaction (the rows vanish with it, nothing
reaches a broker or a worker); expiry is what the sweeper does once a deadline is put in the
past."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.utils import timezone

from console.wsgi import application
from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Operation
from runtime.sandbox import receivers
from runtime.tools.demo import APPROVAL_THRESHOLD_CENTS
from runtime.waits import wait_sweep
from tests import factories

pytestmark = pytest.mark.postgres

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
V1 = "/api/v1"
BIG = APPROVAL_THRESHOLD_CENTS + 1

# Routes of the schema this journey does not call, with why (none at present).
UNEXERCISED: dict[tuple[str, str], str] = {}


class World:
    """The principals, one HTTP client per principal, and the ids the journey has made."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.agent = factories.agent()
        self.operator = factories.console_user("operator")
        self.operator2 = factories.console_user("operator")
        self.admin = factories.console_user("admin")
        self.ids: dict[str, Any] = {}

    def call(self, who: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        token = getattr(self, who).token
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        return self.http.request(method, V1 + path, headers=headers, **kwargs)

    def __getitem__(self, key: str) -> Any:
        return self.ids[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.ids[key] = value


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # as docs/openapi.yaml names it
    status: int
    call: Callable[[World], httpx.Response]
    keep: Callable[[World, dict[str, Any]], None] | None = None  # what the journey reads back


def get(who: str, path: str, **params: Any) -> Callable[[World], httpx.Response]:
    """A GET by ``who``; ``path``'s {names} are the journey's ids."""
    return lambda w: w.call(who, "GET", path.format(**w.ids), params=params or None)


def post(who: str, path: str, body: Any = None) -> Callable[[World], httpx.Response]:
    return lambda w: w.call(who, "POST", path.format(**w.ids), json=body)


def patch(who: str, path: str, body: Any) -> Callable[[World], httpx.Response]:
    return lambda w: w.call(who, "PATCH", path.format(**w.ids), json=body)


def leased(op: str, action: str, **body: Any) -> Callable[[World], httpx.Response]:
    """A call under the lease the last claim returned."""
    return lambda w: w.call(
        "agent", "POST", f"/operations/{w[op]}/{action}", json={**w["lease"], **body}
    )


def _expire_wait(w: World, key: str) -> None:
    Operation.objects.filter(pk=w[key]).update(wait_until=timezone.now() - timedelta(seconds=1))
    wait_sweep()
    assert Operation.objects.get(pk=w[key]).status == "expired"


def _expire_approval(w: World, key: str) -> None:
    Approval.objects.filter(pk=w[key]).update(expires_at=timezone.now() - timedelta(seconds=1))
    approval_expire_sweep()
    assert Approval.objects.get(pk=w[key]).status == "expired"


def _op(task: str, step: str, **body: Any) -> Callable[[World], httpx.Response]:
    return lambda w: w.call(
        "agent", "POST", f"/tasks/{w[task]}/operations", json={"step": step, **body}
    )


def _charge(task: str, step: str) -> Callable[[World], httpx.Response]:
    return _op(
        task, step, tool="demo.payments.charge", params={"account": "a-1", "amount_cents": BIG}
    )


def _approval_of(op_key: str, into: str) -> Callable[[World, dict[str, Any]], None]:
    def keep(w: World, body: dict[str, Any]) -> None:
        w[op_key] = body["id"]
        w[into] = Approval.objects.get(operation_id=body["id"], status="pending").pk

    return keep


def _set(key: str, field: str = "id") -> Callable[[World, dict[str, Any]], None]:
    def keep(w: World, body: dict[str, Any]) -> None:
        w[key] = body[field]

    return keep


def _upload(w: World) -> httpx.Response:
    return w.call(
        "agent",
        "POST",
        f"/tasks/{w['task']}/artifacts",
        files={"file": ("report.txt", b"all good\n", "text/plain")},
        data={"name": "report.txt"},
    )


def _lease(w: World, body: dict[str, Any]) -> None:
    w["lease"] = {"lease_token": body["lease_token"], "lease_generation": body["lease_generation"]}


def _resolve(w: World) -> httpx.Response:
    # An operation whose outcome nobody knows, as a lost worker leaves it.
    Operation.objects.filter(pk=w["worker_op"]).update(status="unresolved")
    version = Operation.objects.get(pk=w["worker_op"]).state_version
    return w.call(
        "admin",
        "POST",
        f"/operations/{w['worker_op']}/resolve",
        json={
            "resolution": "no_effect",
            "evidence": "checked the ledger",
            "state_version": version,
        },
    )


def _renew_approval(w: World) -> httpx.Response:
    _expire_approval(w, "approval_renew")
    return w.call(
        "admin",
        "POST",
        f"/approvals/{w['approval_renew']}/renew",
        json={"expires_in_seconds": 600, "reason": "back from holiday"},
    )


def _wait_then(action: str, status_key: str) -> Callable[[World], httpx.Response]:
    def call(w: World) -> httpx.Response:
        _expire_wait(w, status_key)
        body: dict[str, Any] = {"reason": "admin"}
        if action == "renew":
            body["expires_in_seconds"] = 600
        return w.call("admin", "POST", f"/waits/{w[status_key]}/{action}", json=body)

    return call


def _give(w: World) -> httpx.Response:
    return w.call(
        "operator",
        "POST",
        f"/queues/approvals/items/{w['gated_op']}/give",
        json={"to": w.operator2.actor.name},
    )


def _approve(w: World) -> httpx.Response:
    approval = w.call("operator", "GET", f"/approvals/{w['approval_edited']}").json()
    return w.call(
        "operator2",
        "POST",
        f"/approvals/{w['approval_edited']}/decision",
        json={"decision": "approve", "params_hash": approval["params_hash"]},
    )


def _accept(w: World) -> httpx.Response:
    task = w.call("agent", "GET", f"/tasks/{w['task']}").json()
    return w.call(
        "agent",
        "POST",
        f"/artifacts/{w['artifact']}/accept",
        json={"expected_state_version": task["state_version"]},
    )


def _effects(w: World) -> httpx.Response:
    # The charge's effect as a worker would make it at the sandbox's receiver.
    op = Operation.objects.get(pk=w["small_charge"])
    receivers.payments_charge(key=op.idempotency_key, body=op.params, fencing_token=1)
    return w.call(
        "agent", "GET", "/demo/receivers/payments/effects", params={"key": op.idempotency_key}
    )


def _bulk_deny(w: World) -> httpx.Response:
    item = {"approval": w["approval_bulk"], "decision": "deny", "reason": "asked twice"}
    return w.call("operator", "POST", "/approvals/decisions", json={"decisions": [item]})


def _patch_schedule(w: World) -> httpx.Response:
    version = w.call("agent", "GET", f"/schedules/{w['schedule']}").json()["version"]
    return w.call(
        "agent",
        "PATCH",
        f"/schedules/{w['schedule']}",
        json={"interval_seconds": 7200, "version": version},
    )


TOOL = {
    "name": "acme.review.note",  # the paths below name it
    "kind": "agent",
    "contract": "pure",
    "description": "A note the agent writes itself.",
    "params_schema": {"type": "object"},
    "approval": {"required": "never"},
}

ROUTES: list[Route] = [
    # The catalogue, and a tool declared without code.
    Route("POST", "/tools/declared", 201, post("admin", "/tools/declared", TOOL)),
    Route("GET", "/tools/declared", 200, get("admin", "/tools/declared")),
    Route("GET", "/tools/declared/{name}", 200, get("admin", "/tools/declared/acme.review.note")),
    Route(
        "PATCH",
        "/tools/declared/{name}",
        200,
        patch(
            "admin", "/tools/declared/acme.review.note", {"version": 1, "description": "Edited."}
        ),
    ),
    Route("GET", "/tools", 200, get("agent", "/tools")),
    # Tasks: created under a key (201), found again under it (200).
    Route(
        "POST",
        "/tasks",
        201,
        post("agent", "/tasks", {"name": "journey", "external_id": "journey"}),
        _set("task"),
    ),
    Route(
        "POST",
        "/tasks",
        200,
        post("agent", "/tasks", {"name": "journey", "external_id": "journey"}),
    ),
    Route(
        "POST",
        "/tasks",
        201,
        post(
            "agent",
            "/tasks",
            {"name": "budgeted", "budget": {"cost_cents": 100_000, "tool_calls": 50}},
        ),
        _set("budgeted"),
    ),
    Route("POST", "/tasks", 201, post("agent", "/tasks", {"name": "to cancel"}), _set("to_cancel")),
    Route("POST", "/tasks", 201, post("agent", "/tasks", {"name": "to fail"}), _set("to_fail")),
    Route(
        "POST", "/tasks", 201, post("agent", "/tasks", {"name": "to complete"}), _set("to_complete")
    ),
    Route("POST", "/tasks", 201, post("agent", "/tasks", {"name": "to end"}), _set("to_end")),
    Route("GET", "/tasks", 200, get("agent", "/tasks", external_id="journey")),
    Route("GET", "/tasks/{task_id}", 200, get("agent", "/tasks/{task}")),
    # Operations: proposed (201), proposed again (200), on a task with and without a budget.
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("task", "greet", tool="demo.echo", params={"text": "hi"}),
        _set("worker_op"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        200,
        _op("task", "greet", tool="demo.echo", params={"text": "hi"}),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op(
            "budgeted",
            "greet",
            tool="demo.echo",
            params={"text": "hi"},
            estimate={"cost_cents": 10},
        ),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("task", "mine", tool="demo.echo", params={"text": "me"}, executor="agent"),
        _set("agent_op"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("budgeted", "mine", tool="demo.echo", params={"text": "me"}, executor="agent"),
        _set("budgeted_agent_op"),
    ),
    Route("GET", "/tasks/{task_id}/operations", 200, get("agent", "/tasks/{task}/operations")),
    Route("GET", "/operations", 200, get("agent", "/operations")),
    Route("GET", "/operations/{operation_id}", 200, get("agent", "/operations/{agent_op}")),
    # The agent runs its own work: claim, heartbeat, complete (both tasks).
    Route(
        "POST",
        "/operations/{operation_id}/claim",
        200,
        post("agent", "/operations/{agent_op}/claim"),
        _lease,
    ),
    Route("POST", "/operations/{operation_id}/heartbeat", 200, leased("agent_op", "heartbeat")),
    Route(
        "POST",
        "/operations/{operation_id}/complete",
        200,
        leased("agent_op", "complete", outcome="succeeded", result={"ok": True}),
    ),
    Route(
        "POST",
        "/operations/{operation_id}/claim",
        200,
        post("agent", "/operations/{budgeted_agent_op}/claim"),
        _lease,
    ),
    Route(
        "POST",
        "/operations/{operation_id}/complete",
        200,
        leased("budgeted_agent_op", "complete", outcome="succeeded", usage={"cost_cents": 5}),
    ),
    Route("GET", "/tasks/{task_id}/budget", 200, get("agent", "/tasks/{budgeted}/budget")),
    Route("POST", "/operations/{operation_id}/resolve", 200, _resolve),
    # Waits and signals.
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("task", "await go", kind="wait_signal", signal="go"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/signals",
        202,
        post(
            "agent", "/tasks/{task}/signals", {"event_id": "e-1", "name": "go", "payload": {"n": 1}}
        ),
    ),
    Route("GET", "/tasks/{task_id}/signals", 200, get("agent", "/tasks/{task}/signals")),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("task", "await renew", kind="wait_signal", signal="renew", timeout_seconds=60),
        _set("wait_renew"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("task", "await transform", kind="wait_signal", signal="x", timeout_seconds=60),
        _set("wait_transform"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op("to_end", "await end", kind="wait_signal", signal="end", timeout_seconds=60),
        _set("wait_end"),
    ),
    Route("GET", "/waits", 200, get("admin", "/waits")),
    Route("POST", "/waits/{operation_id}/renew", 200, _wait_then("renew", "wait_renew")),
    Route(
        "POST", "/waits/{operation_id}/transform", 200, _wait_then("transform", "wait_transform")
    ),
    Route("POST", "/waits/{operation_id}/end", 202, _wait_then("end", "wait_end")),
    # Approvals: listed, read, edited by one operator and approved by another; denied in bulk;
    # renewed by an admin once expired.
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _charge("task", "pay"),
        _approval_of("gated_op", "approval"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _charge("task", "pay twice"),
        _approval_of("gated_op_2", "approval_bulk"),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _charge("task", "pay late"),
        _approval_of("gated_op_3", "approval_renew"),
    ),
    Route("GET", "/approvals", 200, get("operator", "/approvals")),
    Route("GET", "/approvals/{approval_id}", 200, get("operator", "/approvals/{approval}")),
    # Who works on it: taken, handed to another operator, released by them, commented on.
    Route(
        "POST",
        "/queues/{queue}/items/{operation_id}/take",
        200,
        post("operator", "/queues/approvals/items/{gated_op}/take"),
    ),
    Route("POST", "/queues/{queue}/items/{operation_id}/give", 200, _give),
    Route(
        "POST",
        "/queues/{queue}/items/{operation_id}/release",
        200,
        post("operator2", "/queues/approvals/items/{gated_op}/release"),
    ),
    Route(
        "POST",
        "/queues/{queue}/items/{operation_id}/comments",
        201,
        post("operator", "/queues/approvals/items/{gated_op}/comments", {"text": "asked finance"}),
    ),
    Route(
        "GET",
        "/queues/{queue}/items/{operation_id}",
        200,
        get("operator2", "/queues/approvals/items/{gated_op}"),
    ),
    Route(
        "POST",
        "/approvals/{approval_id}/edit",
        201,
        post(
            "operator",
            "/approvals/{approval}/edit",
            {"params": {"account": "a-1", "amount_cents": BIG + 1}, "reason": "one cent more"},
        ),
        _set("approval_edited"),
    ),
    Route("POST", "/approvals/{approval_id}/decision", 200, _approve),
    Route("POST", "/approvals/decisions", 200, _bulk_deny),
    Route("POST", "/approvals/{approval_id}/renew", 200, _renew_approval),
    # Artifacts.
    Route("POST", "/tasks/{task_id}/artifacts", 201, _upload, _set("artifact")),
    Route("GET", "/tasks/{task_id}/artifacts", 200, get("agent", "/tasks/{task}/artifacts")),
    Route("GET", "/artifacts/{artifact_id}", 200, get("agent", "/artifacts/{artifact}")),
    Route(
        "GET",
        "/artifacts/{artifact_id}/content",
        200,
        get("agent", "/artifacts/{artifact}/content"),
    ),
    Route(
        "GET",
        "/artifacts/{artifact_id}/provenance",
        200,
        get("agent", "/artifacts/{artifact}/provenance"),
    ),
    Route("POST", "/artifacts/{artifact_id}/accept", 200, _accept),
    # Checks, events, control.
    Route("GET", "/tasks/{task_id}/checks", 200, get("agent", "/tasks/{task}/checks")),
    Route("POST", "/tasks/{task_id}/checks", 200, post("agent", "/tasks/{task}/checks")),
    Route("GET", "/tasks/{task_id}/events", 200, get("agent", "/tasks/{task}/events")),
    Route(
        "POST",
        "/tasks/{task_id}/pause",
        202,
        post("agent", "/tasks/{task}/pause", {"reason": "lunch"}),
    ),
    Route("POST", "/tasks/{task_id}/resume", 202, post("agent", "/tasks/{task}/resume", {})),
    Route(
        "POST",
        "/tasks/{task_id}/steer",
        202,
        post("operator", "/tasks/{task}/steer", {"direction": "refund only"}),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/cancel",
        202,
        post("admin", "/tasks/{to_cancel}/cancel", {"reason": "not needed"}),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/fail",
        202,
        post("admin", "/tasks/{to_fail}/fail", {"reason": "broken"}),
    ),
    Route(
        "POST",
        "/tasks/{task_id}/attempts",
        201,
        post("agent", "/tasks/{task}/attempts", {"reason": "again"}),
    ),
    Route(
        "POST", "/tasks/{task_id}/complete", 200, post("agent", "/tasks/{to_complete}/complete", {})
    ),
    # Schedules.
    Route(
        "POST",
        "/schedules",
        201,
        post("agent", "/schedules", {"interval_seconds": 3600, "task": {"name": "nightly"}}),
        _set("schedule"),
    ),
    Route("GET", "/schedules", 200, get("agent", "/schedules")),
    Route("GET", "/schedules/{schedule_id}", 200, get("agent", "/schedules/{schedule}")),
    Route("PATCH", "/schedules/{schedule_id}", 200, _patch_schedule),
    Route(
        "POST",
        "/schedules/{schedule_id}/pause",
        200,
        post("agent", "/schedules/{schedule}/pause", {"reason": "quiet week"}),
    ),
    Route(
        "POST",
        "/schedules/{schedule_id}/resume",
        200,
        post("agent", "/schedules/{schedule}/resume", {}),
    ),
    Route(
        "POST",
        "/schedules/{schedule_id}/trigger",
        201,
        post("agent", "/schedules/{schedule}/trigger"),
    ),
    # The demo receivers' record of effects.
    Route(
        "POST",
        "/tasks/{task_id}/operations",
        201,
        _op(
            "task",
            "pay small",
            tool="demo.payments.charge",
            params={"account": "a-1", "amount_cents": 250},
        ),
        _set("small_charge"),
    ),
    Route("GET", "/demo/receivers/{receiver}/effects", 200, _effects),
]


@pytest.fixture(scope="module")
def api_schema() -> Any:
    return schemathesis.openapi.from_path(str(SCHEMA_FILE))


@pytest.fixture
def http(db: None, settings: Any) -> Iterator[httpx.Client]:
    # As Django's test client does: requests must not close the test's connection when they end.
    settings.API_RATE_PER_SECOND = 0
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        with httpx.Client(
            transport=httpx.WSGITransport(app=application), base_url="http://localhost"
        ) as client:
            yield client
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _documented(api_schema: Any) -> set[tuple[str, str]]:
    found = set()
    for result in api_schema.get_all_operations():
        operation = result.ok()
        found.add((operation.method.upper(), operation.path.removeprefix(V1)))
    return found


def test_the_table_names_every_route_of_the_schema(api_schema):
    driven = {(r.method, r.path) for r in ROUTES}
    assert driven | set(UNEXERCISED) == _documented(api_schema)
    assert not driven & set(UNEXERCISED)


@pytest.mark.parametrize("hotpath", [True, False], ids=["one-statement", "general"])
def test_every_routes_answer_conforms_to_docs_openapi(api_schema, http, settings, hotpath):
    settings.HOTPATH = hotpath
    w = World(http)
    failures: list[str] = []
    for route in ROUTES:
        name = f"{route.method} {route.path} -> {route.status}"
        response = route.call(w)
        if response.status_code != route.status:
            failures.append(f"{name}: answered {response.status_code} {response.text[:500]}")
            break  # later calls build on this one
        try:
            api_schema[V1 + route.path][route.method].validate_response(response)
        except Exception as exc:  # a FailureGroup naming each way the answer differs
            failures.append(f"{name}: {exc}"[:3000])
        if route.keep is not None:
            route.keep(w, response.json())
    assert not failures, "\n\n".join(failures)


def test_the_validator_refuses_a_body_the_schema_does_not_describe(api_schema):
    # The journey's checks have teeth: a task's 200 without its required fields is refused.
    request = httpx.Request("GET", "http://localhost/api/v1/tasks/t_1")
    response = httpx.Response(200, json={"id": "t_1"}, request=request)
    response.elapsed = timedelta(0)  # set by a transport once the answer is read
    with pytest.raises(Exception, match=r"(?i)schema|required"):
        api_schema[V1 + "/tasks/{task_id}"]["GET"].validate_response(response)


def test_every_route_documents_429_and_a_refused_pace_conforms(api_schema, http, settings):
    """A token past its pace gets 429 on any route (runtime.throttle, before the view): the
    schema documents it on every route, with the contract's error body."""
    missing = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if "429" not in operation.definition.raw.get("responses", {}):
            missing.append(f"{operation.method.upper()} {operation.path}")
    assert not missing, missing
    settings.API_RATE_PER_SECOND = 0.001
    settings.API_RATE_BURST = 1
    agent = factories.agent()
    headers = {"Authorization": f"Bearer {agent.token}"}
    answers = [http.get(f"{V1}/tasks", headers=headers) for _ in range(3)]
    refused = [r for r in answers if r.status_code == 429]
    assert refused, [r.status_code for r in answers]
    assert refused[0].json()["error"]["code"] == "rate_limited"
    assert int(refused[0].headers["Retry-After"]) > 0
    api_schema[V1 + "/tasks"]["GET"].validate_response(refused[0])
