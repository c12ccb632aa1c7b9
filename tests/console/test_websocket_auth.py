"""The live websockets' security, through the real ASGI stack (origin check, session auth,
routing) with channels' test communicator: who may follow a journal, and that a follower gets
exactly the events after its cursor, in order, then new ones live."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from console.asgi import application
from tests import factories
from tests.conftest import journal_note

pytestmark = [pytest.mark.postgres]

ORIGIN = b"http://127.0.0.1:8000"
TIMEOUT = 10


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await scenario()

    return async_to_sync(main)()


def session_for(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=factories.PASSWORD)
    return client


def socket(path: str, client: Client | None = None, origin: bytes | None = ORIGIN):
    headers = [(b"host", b"127.0.0.1:8000")]
    if origin is not None:
        headers.append((b"origin", origin))
    if client is not None:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def refusal(comm: WebsocketCommunicator) -> int:
    """The close code a refused socket got: at the handshake, or right after it."""
    try:
        connected, code = await comm.connect(timeout=TIMEOUT)
        if not connected:
            return int(code)
        message = await comm.receive_output(timeout=TIMEOUT)
        assert message["type"] == "websocket.close", message
        return int(message["code"])
    finally:
        await comm.disconnect()


async def next_close(comm: WebsocketCommunicator) -> int:
    while True:
        message = await comm.receive_output(timeout=TIMEOUT)
        if message["type"] == "websocket.close":
            return int(message.get("code", 1000))


def append(task_id: str, n: int = 1) -> None:
    for i in range(n):
        journal_note(task_id, f"note {i}")


def test_anonymous_socket_is_closed_with_4401(transactional_db):
    task = factories.task(factories.agent())
    assert run(lambda: refusal(socket(f"/ws/tasks/{task.pk}/"))) == 4401
    assert run(lambda: refusal(socket("/ws/feed/"))) == 4401


def test_forged_or_stale_session_cookie_is_4401(transactional_db):
    task = factories.task(factories.agent())
    operator = factories.console_user("operator")
    client = session_for(operator.actor.name)
    client.cookies["sessionid"] = "not-a-session-key"
    assert run(lambda: refusal(socket(f"/ws/tasks/{task.pk}/", client))) == 4401


@pytest.mark.parametrize(
    "origin", [b"http://evil.example", b"http://127.0.0.1.evil.example", b"null", None]
)
def test_foreign_or_missing_origin_is_refused_even_with_a_valid_session(transactional_db, origin):
    task = factories.task(factories.agent())
    operator = factories.console_user("operator")
    client = session_for(operator.actor.name)

    async def scenario() -> tuple[bool, Any]:
        comm = socket(f"/ws/tasks/{task.pk}/", client, origin=origin)
        try:
            return await comm.connect(timeout=TIMEOUT)
        finally:
            await comm.disconnect()

    connected, _ = run(scenario)
    assert connected is False
    # The same cookie from the console's own origin is let in.
    assert run(lambda: _accepted(socket(f"/ws/tasks/{task.pk}/", client)))


async def _accepted(comm: WebsocketCommunicator) -> bool:
    try:
        connected, _ = await comm.connect(timeout=TIMEOUT)
        return bool(connected)
    finally:
        await comm.disconnect()


def test_user_without_a_console_role_is_closed_with_4403(transactional_db):
    task = factories.task(factories.agent())
    get_user_model().objects.create_user("no-role", password=factories.PASSWORD)
    client = session_for("no-role")
    assert run(lambda: refusal(socket(f"/ws/tasks/{task.pk}/", client))) == 4403
    assert run(lambda: refusal(socket("/ws/feed/", client))) == 4403


def test_unknown_task_is_closed_with_4404(transactional_db):
    operator = factories.console_user("operator")
    client = session_for(operator.actor.name)
    assert run(lambda: refusal(socket("/ws/tasks/tsk_does_not_exist/", client))) == 4404


@pytest.mark.parametrize("role", ["operator", "support", "admin"])
def test_follower_gets_exactly_the_events_after_its_cursor_then_live_ones(transactional_db, role):
    task = factories.task(factories.agent())
    append(task.pk, 5)  # seq 2..6 after task.created
    user = factories.console_user(role)
    client = session_for(user.actor.name)

    async def scenario() -> list[int]:
        comm = socket(f"/ws/tasks/{task.pk}/?after=3", client)
        try:
            connected, _ = await comm.connect(timeout=TIMEOUT)
            assert connected
            seqs = []
            for _ in range(3):
                message = await comm.receive_json_from(timeout=TIMEOUT)
                assert message["type"] == "event"
                seqs.append(int(message["event"]["id"]))
            # Written after the catch-up: arrives next, once (a repeat of 4..6 would come first).
            await database_sync_to_async(append)(task.pk, 2)
            for _ in range(2):
                message = await comm.receive_json_from(timeout=TIMEOUT)
                seqs.append(int(message["event"]["id"]))
                assert message["event"]["type"] == "task.note"
            return seqs
        finally:
            await comm.disconnect()

    assert run(scenario) == [4, 5, 6, 7, 8]


@pytest.mark.parametrize("after", ["", "?after=", "?after=-5", "?after=abc", "?after=1.5"])
def test_missing_or_malformed_cursor_starts_from_the_beginning(transactional_db, after):
    task = factories.task(factories.agent())
    append(task.pk, 1)
    operator = factories.console_user("operator")
    client = session_for(operator.actor.name)

    async def scenario() -> list[int]:
        comm = socket(f"/ws/tasks/{task.pk}/{after}", client)
        try:
            connected, _ = await comm.connect(timeout=TIMEOUT)
            assert connected
            return [
                int((await comm.receive_json_from(timeout=TIMEOUT))["event"]["id"])
                for _ in range(2)
            ]
        finally:
            await comm.disconnect()

    assert run(scenario) == [1, 2]


def test_losing_the_role_or_logging_out_ends_a_live_socket(transactional_db, settings):
    settings.TOKEN_RECHECK_SECONDS = 0.0
    task = factories.task(factories.agent())
    operator = factories.console_user("operator")
    client = session_for(operator.actor.name)
    user = get_user_model().objects.get(username=operator.actor.name)

    async def follow_until_closed(act: Callable[[], None]) -> int:
        comm = socket(f"/ws/tasks/{task.pk}/", client)
        try:
            connected, _ = await comm.connect(timeout=TIMEOUT)
            assert connected
            assert (await comm.receive_json_from(timeout=TIMEOUT))["event"]["id"] == "1"
            await database_sync_to_async(act)()
            return await next_close(comm)
        finally:
            await comm.disconnect()

    assert run(lambda: follow_until_closed(client.logout)) == 4401

    client = session_for(operator.actor.name)
    assert run(lambda: follow_until_closed(lambda: user.groups.clear())) == 4403


def test_follower_keeps_pages_live_without_any_hint(transactional_db, monkeypatch):
    """Embedded mode's situation (a worker cannot reach the web process's in-memory layer):
    with every hint lost, the consumer still follows the journal itself."""
    from runtime import events

    monkeypatch.setattr(events, "event_hint", lambda *args, **kwargs: None)
    task = factories.task(factories.agent())
    operator = factories.console_user("operator")
    client = session_for(operator.actor.name)

    async def scenario() -> list[int]:
        comm = socket(f"/ws/tasks/{task.pk}/?after=1", client)
        try:
            connected, _ = await comm.connect(timeout=TIMEOUT)
            assert connected
            await database_sync_to_async(append)(task.pk, 2)
            return [
                int((await comm.receive_json_from(timeout=TIMEOUT))["event"]["id"])
                for _ in range(2)
            ]
        finally:
            await comm.disconnect()

    assert run(scenario) == [2, 3]
