"""Helpers for tests of open streams against the real server (console.server): a browser
session for a console user, logging it out the way the browser does, a live websocket, and an
event stream read on a thread of its own."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.test import Client
from websockets.sync.client import ClientConnection, connect

from tests.conftest import Server


def session_of(user: Any) -> str:
    """A signed-in browser session for ``user`` (its ``sessionid``), in the shared database."""
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def logout(server: Server, sessionid: str) -> None:
    """``POST /logout/`` with that session and its CSRF token, as the console's button does."""
    with httpx.Client(base_url=server.url, cookies={"sessionid": sessionid}) as client:
        assert client.get("/login/").status_code == 200
        answer = client.post(
            "/logout/", headers={"X-CSRFToken": client.cookies["csrftoken"]}, data={}
        )
        assert answer.status_code == 302, answer.text[:300]


def websocket(server: Server, path: str, sessionid: str) -> ClientConnection:
    """A live socket of the console's own origin, with that session's cookie."""
    return connect(
        server.url.replace("http://", "ws://") + path,
        origin=server.url,  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={sessionid}"},
        proxy=None,
        open_timeout=10,
    )


@dataclass
class EventStream:
    """``GET /api/v1/tasks/{id}/events`` as server-sent events, read on a thread; ``ended`` is set
    when the server ends the response."""

    server: Server
    task_id: str
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)

    def start(self) -> EventStream:
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.server.url, cookies=self.cookies, timeout=60) as client,
                client.stream(
                    "GET",
                    f"/api/v1/tasks/{self.task_id}/events",
                    headers={"Accept": "text/event-stream", **self.headers},
                ) as response,
            ):
                for line in response.iter_lines():
                    self.lines.append(line)
        finally:
            self.ended.set()

    def saw_event(self, seq: int) -> bool:
        return f"id: {seq}" in self.lines

    def error(self) -> dict[str, Any] | None:
        """The error the stream ended with (its last ``event: error``), if any."""
        for i, line in enumerate(self.lines):
            if line == "event: error" and i + 1 < len(self.lines):
                return dict(json.loads(self.lines[i + 1].removeprefix("data: "))["error"])
        return None
