"""Text PostgreSQL cannot store (a NUL) reaching the console's pages, fragments, forms and
websockets: refused at the edge (400, or 404 for a path that names nothing), and, where a view
would still hand it to the database, the DataError is a 400 page through the one error mapping,
never a 500. Nothing changes either way. On PostgreSQL: SQLite stores NUL without complaint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from console.asgi import application
from runtime.models import Event, Operation, Task
from tests import factories

pytestmark = [pytest.mark.postgres]

EDGE = "console.middleware.InputEdgeMiddleware"


@pytest.fixture
def world(db) -> Iterator[dict]:
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task)
    Operation.objects.filter(pk=op.pk).update(status="unresolved")
    admin = factories.console_user("admin")
    client = Client()
    assert client.login(username=admin.actor.name, password=factories.PASSWORD)
    yield {"client": client, "task": task, "op": Operation.objects.get(pk=op.pk)}


def _snapshot() -> tuple:
    return (
        Event.objects.count(),
        list(Task.objects.values_list("pk", "cancellation", "state_version")),
        list(Operation.objects.values_list("pk", "status", "state_version")),
    )


def _assert_refused_page(response, status: int) -> None:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("text/html")


GETS = [
    "/tasks/?q=%00",
    "/tasks/?q=a%00b",
    "/tasks/?condition=%00",
    "/fragments/tasks?q=%00",
    "/?x=%00",
    "/unresolved/?%00=1",
]


@pytest.mark.parametrize("path", GETS)
def test_a_nul_in_a_query_is_a_400_page(world, path):
    before = _snapshot()
    _assert_refused_page(world["client"].get(path), 400)
    assert _snapshot() == before


@pytest.mark.parametrize("path", ["/tasks/%00/", "/tasks/%00/live", "/tasks/a%00b/"])
def test_a_nul_in_a_page_path_is_a_404_page(world, path):
    _assert_refused_page(world["client"].get(path), 404)


def test_a_nul_in_the_cancel_route_or_its_form_changes_nothing(world):
    before = _snapshot()
    task = world["task"]
    _assert_refused_page(world["client"].post("/tasks/%00/cancel", {"reason": "x"}), 404)
    _assert_refused_page(world["client"].post(f"/tasks/{task.pk}/cancel", {"reason": "a\x00"}), 400)
    assert _snapshot() == before


@pytest.mark.parametrize(
    "form",
    [
        {"resolution": "no_effect", "evidence": "seen\x00", "state_version": "{v}"},
        {"resolution": "no\x00_effect", "evidence": "seen", "state_version": "{v}"},
        {"resolution": "no_effect", "evidence": "seen", "state_version": "{v}", "x\x00": "1"},
    ],
    ids=["evidence", "resolution", "field-name"],
)
def test_a_nul_in_the_resolve_form_changes_nothing(world, form):
    op = world["op"]
    data = {k: v.format(v=op.state_version) for k, v in form.items()}
    before = _snapshot()
    _assert_refused_page(world["client"].post(f"/unresolved/{op.pk}/resolve", data), 400)
    _assert_refused_page(world["client"].post("/unresolved/%00/resolve", data), 404)
    assert _snapshot() == before


@pytest.mark.parametrize("path", ["/tasks/?q=%00", "/fragments/tasks?q=%00"])
def test_without_the_edge_the_database_refusal_is_still_a_400_page(world, path, settings):
    # The edge is the first line; the error mapping is the second, for what it did not foresee.
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != EDGE]
    _assert_refused_page(world["client"].get(path), 400)


def test_without_the_edge_the_api_maps_the_database_refusal_too(db, settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != EDGE]
    response = factories.agent().client().get("/api/v1/tasks", {"q": "\x00"})
    # The API's own parameter check refuses it (400 in the error format).
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_input"


@pytest.mark.parametrize(
    "path", ["/ws/tasks/%00/", "/ws/tasks/\x00/", "/ws/tasks/a\x00b/?after=1", "/ws/nope/"]
)
def test_a_nul_in_a_websocket_route_is_closed_with_4404(world, path):
    client = world["client"]

    async def scenario() -> int:
        comm = WebsocketCommunicator(
            application,
            path,
            headers=[
                (b"host", b"127.0.0.1:8000"),
                (b"origin", b"http://127.0.0.1:8000"),
                (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
            ],
        )
        try:
            connected, code = await comm.connect(timeout=10)
            if not connected:
                return int(code)
            message = await comm.receive_output(timeout=10)
            return int(message["code"])
        finally:
            await comm.disconnect()

    assert async_to_sync(scenario)() == 4404
