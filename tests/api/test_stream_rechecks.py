# ruff: noqa: E501 (the rechecks are a table: one row per line)
"""The authorization matrix's companion for what stays open: every event stream and live socket
rechecks the principal that opened it every ``TOKEN_RECHECK_SECONDS`` (one rule,
runtime.policy.can_keep_streaming) and ends once it no longer holds. Against the real server
(console.server) and real Redis, with the cadence set small; docs/security.md shows the same table.

Cells: for an event stream, the status of the ``event: error`` it ends with (401
``not_authenticated``, 403 ``not_authorized``); for a websocket, its close code; ``None`` where
the principal cannot open that stream (see the matrix) or cannot undergo that change.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from websockets.exceptions import ConnectionClosed

from runtime.models import ApiToken
from runtime.tokens import token_revoke
from tests import factories
from tests.api.test_authorization_matrix import MATRIX, OPEN, PRINCIPALS
from tests.conftest import Server, journal_note, server_start, wait_for
from tests.streams import EventStream, logout, session_of, websocket

pytestmark = [pytest.mark.postgres]

RECHECK_SECONDS = 0.3
# A generous bound for "within the cadence" on a loaded machine, far below any fixed period a
# stream could otherwise be rechecked at.
ENDS_WITHIN = 8.0
SSE = "api/v1/tasks/<id:task_id>/events"
# On the unresolved queue's page, which support staff and admins work (an operator is refused).
PRESENCE = "ws/presence/<str:queue>/"
_ = None

# stream, route, change -> one cell per principal, in the matrix's PRINCIPALS order:
#                                             anon owner other oper  supp  admin oper_t supp_t admin_t
RECHECKS: dict[tuple[str, str, str], tuple[Any, ...]] = {
    ("GET", SSE, "logout"):                     (_, _,   _,    401,  401,  401,  _,    _,    _),
    ("GET", SSE, "deactivated"):                (_, _,   _,    401,  401,  401,  401,  401,  401),
    ("GET", SSE, "role removed"):               (_, _,   _,    403,  403,  403,  403,  403,  403),
    ("GET", SSE, "token revoked"):              (_, 401, _,    _,    _,    _,    401,  401,  401),
    ("WS", "ws/tasks/<id:task_id>/", "logout"): (_, _,   _,    4401, 4401, 4401, _,    _,    _),
    ("WS", "ws/tasks/<id:task_id>/", "deactivated"): (_, _, _, 4401, 4401, 4401, _,    _,    _),
    ("WS", "ws/tasks/<id:task_id>/", "role removed"): (_, _, _, 4403, 4403, 4403, _,   _,    _),
    ("WS", "ws/feed/", "logout"):               (_, _,   _,    4401, 4401, 4401, _,    _,    _),
    ("WS", "ws/feed/", "deactivated"):          (_, _,   _,    4401, 4401, 4401, _,    _,    _),
    ("WS", "ws/feed/", "role removed"):         (_, _,   _,    4403, 4403, 4403, _,    _,    _),
    ("WS", PRESENCE, "logout"):                 (_, _,   _,    _,    4401, 4401, _,    _,    _),
    ("WS", PRESENCE, "deactivated"):            (_, _,   _,    _,    4401, 4401, _,    _,    _),
    ("WS", PRESENCE, "role removed"):           (_, _,   _,    _,    4403, 4403, _,    _,    _),
}  # fmt: skip
SSE_CODES = {401: "not_authenticated", 403: "not_authorized"}


def _streams() -> set[tuple[str, str]]:
    """The matrix's routes that stay open: the event stream and every websocket route."""
    return {(m, r) for m, r in MATRIX if m == "WS" or (m, r) == ("GET", SSE)}


def test_every_stream_of_the_matrix_has_its_rechecks():
    covered = {(m, r) for m, r, _change in RECHECKS}
    assert covered == _streams(), "add the stream's rows to RECHECKS (and to docs/security.md)"
    for (method, route, change), cells in RECHECKS.items():
        assert len(cells) == len(PRINCIPALS), (route, change)
        admitted = MATRIX[(method, route)]
        for name, cell, opens in zip(PRINCIPALS, cells, admitted, strict=True):
            # A recheck is shown only for principals the matrix lets open the stream.
            assert cell is None or opens in (200, OPEN), (route, change, name)


@pytest.fixture(scope="module")
def stream_server(
    django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    web = server_start(
        Path(tmp_path_factory.mktemp("streams")), TOKEN_RECHECK_SECONDS=str(RECHECK_SECONDS)
    )
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
def fast_passwords(settings: Any) -> None:
    # Accounts are made per cell; sessions are made directly, so no password is ever checked.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _cases() -> list[Any]:
    """One case per principal and change: every stream that principal opens, all at once."""
    cases = {
        (change, name)
        for (_m, _r, change), cells in RECHECKS.items()
        for name, cell in zip(PRINCIPALS, cells, strict=True)
        if cell is not None
    }
    return [pytest.param(change, name, id=f"{name}: {change}") for change, name in sorted(cases)]


def _principal(name: str, owner: factories.Principal) -> factories.Principal:
    if name == "owner_agent":
        return owner
    return factories.console_user(name.removesuffix("_token"))


def _change(change: str, principal: factories.Principal, server: Server, sessionid: str) -> None:
    users = get_user_model().objects.filter(pk=principal.actor.user_id)
    if change == "logout":
        logout(server, sessionid)
    elif change == "deactivated":
        assert users.update(is_active=False) == 1
    elif change == "role removed":
        users.get().groups.clear()
    elif change == "token revoked":
        assert token_revoke(ApiToken.objects.get(prefix=principal.token.split("_")[1]).pk)
    else:  # pragma: no cover
        raise AssertionError(change)


def _close_code(ws: Any) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=ENDS_WITHIN)
    assert closed.value.rcvd is not None, "closed without a close frame"
    return int(closed.value.rcvd.code)


@pytest.mark.parametrize(("change", "name"), _cases())
def test_open_streams_end_once_their_principal_no_longer_holds(
    transactional_db, fast_passwords, stream_server, change, name
):
    owner = factories.agent()
    task = factories.task(owner)
    principal = _principal(name, owner)
    by_token = name == "owner_agent" or name.endswith("_token")
    sessionid = "" if by_token else session_of(principal.actor_user())
    expected = {
        (method, route): cells[PRINCIPALS.index(name)]
        for (method, route, row_change), cells in RECHECKS.items()
        if row_change == change and cells[PRINCIPALS.index(name)] is not None
    }
    streams: dict[tuple[str, str], Any] = {}
    with contextlib.ExitStack() as open_streams:
        for method, route in expected:
            if method == "GET":
                stream = EventStream(
                    stream_server,
                    task.pk,
                    headers=principal.headers if by_token else {},
                    cookies={} if by_token else {"sessionid": sessionid},
                ).start()
                wait_for(lambda s=stream: s.saw_event(1) or s.ended.is_set(), what="the stream")
                assert not stream.ended.is_set(), stream.lines
                streams[(method, route)] = stream
            else:
                path = "/" + route.replace("<id:task_id>", task.pk)
                path = path.replace("<str:queue>", "unresolved")
                ws = open_streams.enter_context(websocket(stream_server, path, sessionid))
                journal_note(task.pk, route)  # a message proves the socket is open and followed
                # (presence says who else is there as it opens)
                assert json.loads(ws.recv(timeout=30))["type"] in ("event", "hint", "presence")
                streams[(method, route)] = ws
        _change(change, principal, stream_server, sessionid)
        ended: dict[tuple[str, str], Any] = {}
        for key, stream in streams.items():
            if key[0] == "GET":
                assert stream.ended.wait(timeout=ENDS_WITHIN), f"the event stream outlived {change}"
                error = stream.error()
                ended[key] = next(
                    (
                        status
                        for status, code in SSE_CODES.items()
                        if error and error["code"] == code
                    ),
                    stream.lines,
                )
            else:
                ended[key] = _close_code(stream)
    assert ended == expected


def test_a_stream_whose_principal_still_holds_stays_open_across_rechecks(
    transactional_db, fast_passwords, stream_server
):
    """The control: many rechecks pass, and the stream and the socket still deliver."""
    owner = factories.agent()
    task = factories.task(owner)
    sessionid = session_of(factories.console_user("operator").actor_user())
    stream = EventStream(stream_server, task.pk, cookies={"sessionid": sessionid}).start()
    with websocket(stream_server, f"/ws/tasks/{task.pk}/?after=1", sessionid) as ws:
        wait_for(lambda: stream.saw_event(1), what="the stream")
        deadline = time.monotonic() + 10 * RECHECK_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            with pytest.raises(TimeoutError):
                ws.recv(timeout=left)
        assert not stream.ended.is_set(), stream.lines
        journal_note(task.pk, "still here")
        assert json.loads(ws.recv(timeout=30))["event"]["id"] == "2"
        wait_for(lambda: stream.saw_event(2), what="the stream's next event")
    logout(stream_server, sessionid)
    assert stream.ended.wait(timeout=30)
