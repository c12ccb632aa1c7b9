"""The task's journal over REST: pages strictly after a cursor, oldest first, that join without
gap or repeat; and the same as server-sent events from the real web server, resumable with
``Last-Event-ID``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runtime.models import Event
from tests import factories
from tests.api.support import assert_error

pytestmark = pytest.mark.postgres

EVENT_FIELDS = {"id", "type", "at", "state_version", "data"}


def _task_with_events(owner: factories.Principal, operations: int) -> Any:
    task = factories.task(owner)
    for i in range(operations):
        factories.operation(owner, task, step=f"s{i}")
    return task


def _journal(task: Any) -> list[str]:
    return [
        str(seq)
        for seq in Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True)
    ]


def test_events_from_the_start_oldest_first(db):
    alice = factories.agent()
    task = _task_with_events(alice, 3)
    response = alice.client().get(f"/api/v1/tasks/{task.pk}/events")
    assert response.status_code == 200
    body = response.json()
    events = body["events"]
    assert [e["id"] for e in events] == _journal(task) == ["1", "2", "3", "4"]
    assert [e["type"] for e in events] == ["task.created"] + ["operation.proposed"] * 3
    assert all(set(e) >= EVENT_FIELDS for e in events)
    assert body["next"] == "4"
    assert all(e["at"].endswith("Z") for e in events)


def test_events_strictly_after_the_cursor(db):
    alice = factories.agent()
    task = _task_with_events(alice, 4)
    body = alice.client().get(f"/api/v1/tasks/{task.pk}/events", {"after": "2"}).json()
    assert [e["id"] for e in body["events"]] == ["3", "4", "5"]
    assert body["next"] == "5"


def test_paging_with_next_has_no_gap_and_no_duplicate(db):
    alice = factories.agent()
    task = _task_with_events(alice, 6)
    client = alice.client()
    seen: list[str] = []
    after = None
    for _ in range(20):
        query = {"limit": "2"} if after is None else {"limit": "2", "after": after}
        body = client.get(f"/api/v1/tasks/{task.pk}/events", query).json()
        if not body["events"]:
            # At the end the cursor stays where it was, so polling can go on from it.
            assert body["next"] == after
            break
        assert len(body["events"]) <= 2
        seen += [e["id"] for e in body["events"]]
        after = body["next"]
    assert seen == _journal(task)

    # New events after the last page are exactly what the saved cursor returns next.
    factories.operation(alice, task, step="late")
    body = client.get(f"/api/v1/tasks/{task.pk}/events", {"after": after}).json()
    assert [e["id"] for e in body["events"]] == [str(int(after) + 1)]
    assert body["events"][0]["type"] == "operation.proposed"


def test_a_cursor_past_the_end_returns_nothing(db):
    alice = factories.agent()
    task = _task_with_events(alice, 1)
    body = alice.client().get(f"/api/v1/tasks/{task.pk}/events", {"after": "99"}).json()
    assert body == {"events": [], "next": "99"}


@pytest.mark.parametrize("after", ["abc", "-1", "1.5", "1e3", "0x10"])
def test_a_bad_after_is_400(db, after):
    alice = factories.agent()
    task = factories.task(alice)
    response = alice.client().get(f"/api/v1/tasks/{task.pk}/events", {"after": after})
    assert_error(response, 400, "invalid_input")


@pytest.mark.parametrize("limit", ["0", "-3", "x", "100000"])
def test_a_bad_limit_is_400(db, limit):
    alice = factories.agent()
    task = factories.task(alice)
    response = alice.client().get(f"/api/v1/tasks/{task.pk}/events", {"limit": limit})
    assert_error(response, 400, "invalid_input")


# --- server-sent events against a real server --------------------------------------------


def _sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Parse a text/event-stream into its events (comments and retry lines skipped)."""
    current: dict[str, Any] = {}
    for line in lines:
        if line == "":
            if "data" in current:
                yield current
            current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            current["data"] = json.loads(value)
        elif field in ("id", "event"):
            current[field] = value


def _stream(server, owner, task_id: str, max_seconds: float, **headers: str) -> list[dict]:
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "GET",
            f"{server.url}/api/v1/tasks/{task_id}/events",
            params={"max_seconds": str(max_seconds)},
            headers={**owner.headers, "Accept": "text/event-stream", **headers},
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(_sse(response.iter_lines()))


def test_sse_streams_the_journal_with_ids_and_resumes_after_last_event_id(server):
    alice = factories.agent()
    task = _task_with_events(alice, 4)
    journal = _journal(task)

    events = _stream(server, alice, task.pk, 2)
    assert [e["id"] for e in events] == journal
    assert [e["event"] for e in events] == ["task.created"] + ["operation.proposed"] * 4
    for event in events:
        assert event["data"]["id"] == event["id"]
        assert set(event["data"]) >= EVENT_FIELDS

    resumed = _stream(server, alice, task.pk, 2, **{"Last-Event-ID": events[2]["id"]})
    assert [e["id"] for e in resumed] == journal[3:]


def test_sse_delivers_events_appended_while_connected(server):
    alice = factories.agent()
    task = factories.task(alice)
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "GET",
            f"{server.url}/api/v1/tasks/{task.pk}/events",
            params={"max_seconds": "25"},
            headers={**alice.headers, "Accept": "text/event-stream"},
        ) as response,
    ):
        assert response.status_code == 200
        events = _sse(response.iter_lines())
        first = next(events)
        assert (first["id"], first["event"]) == ("1", "task.created")
        op = factories.operation(alice, task, step="live")
        live = next(events)
        assert live["id"] == "2"
        assert live["data"]["operation"] == op.pk


def test_sse_is_woken_by_journal_hints_not_by_polling(transactional_db, tmp_path):
    """With the safety-net poll longer than the stream lives, an event appended while the
    client is connected still arrives: the journal hint woke the stream."""
    from tests.conftest import server_start

    srv = server_start(tmp_path, SSE_SAFETY_POLL_SECONDS=3600)
    try:
        alice = factories.agent()
        task = factories.task(alice)
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "GET",
                f"{srv.url}/api/v1/tasks/{task.pk}/events",
                params={"max_seconds": "40"},
                headers={**alice.headers, "Accept": "text/event-stream"},
            ) as response,
        ):
            events = _sse(response.iter_lines())
            assert next(events)["event"] == "task.created"
            op = factories.operation(alice, task, step="hinted")
            live = next(events)  # the stream would end (40 s) long before a poll (3600 s)
            assert live["data"]["operation"] == op.pk
    finally:
        srv.stop()


def test_sse_for_another_agents_task_is_a_json_404(server):
    alice, bob = factories.agent(), factories.agent()
    task = factories.task(alice)
    response = httpx.get(
        f"{server.url}/api/v1/tasks/{task.pk}/events",
        params={"max_seconds": "1"},
        headers={**bob.headers, "Accept": "text/event-stream"},
        timeout=30,
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_sse_with_a_bad_last_event_id_is_400(server):
    alice = factories.agent()
    task = factories.task(alice)
    response = httpx.get(
        f"{server.url}/api/v1/tasks/{task.pk}/events",
        headers={**alice.headers, "Accept": "text/event-stream", "Last-Event-ID": "nope"},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_input"
