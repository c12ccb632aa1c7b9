"""The Python client (client/, ``agent_console_client``) against the real web server
(console.server over a real socket) on the test database: retries that cannot duplicate, an
event stream that resumes without loss or repeats, a lease that stops on ``stale_lease``."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from agent_console_client import AsyncClient, Client, RetryPolicy, errors
from django.db.models.functions import Now

from runtime.models import Event, Operation, Task
from runtime.sweeper import sweep_once
from tests import factories
from tests.client.conftest import CutStream, DropAfterForward, Gate
from tests.conftest import journal_note, wait_for

pytestmark = pytest.mark.postgres

FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.5)


def _client(server, token, transport: httpx.BaseTransport | None = None) -> Client:
    http = httpx.Client(transport=transport, timeout=30) if transport else None
    return Client(base_url=server.url, token=token, http=http, retry=FAST)


def _first(method: str, path_end: str):
    """A predicate true for the first request to a path ending so, false afterwards."""
    seen: list[httpx.Request] = []

    def drop(request: httpx.Request) -> bool:
        if request.method == method and request.url.path.endswith(path_end) and not seen:
            seen.append(request)
            return True
        return False

    return drop


def test_a_create_retried_after_a_dropped_response_makes_one_task(server):
    agent = factories.agent()
    transport = DropAfterForward(_first("POST", "/api/v1/tasks"))
    console = _client(server, agent.token, transport)

    task = console.create_task("once only", {"n": 1})

    assert Task.objects.count() == 1 and Task.objects.get().pk == task.id
    posts = [r for r in transport.sent if r.method == "POST"]
    assert len(posts) == 2  # the dropped try and its retry
    keys = {r.headers["Idempotency-Key"] for r in posts}
    assert len(keys) == 1 and keys != {""}


def test_a_propose_retried_after_a_dropped_response_makes_one_operation(server):
    agent = factories.agent()
    task = factories.task(agent)
    transport = DropAfterForward(_first("POST", "/operations"))
    console = _client(server, agent.token, transport)

    op = console.propose(task.pk, "demo.echo", {"text": "hi"}, step="greet", executor="agent")
    again = console.propose(task.pk, "demo.echo", {"text": "hi"}, step="greet", executor="agent")

    assert again.id == op.id
    assert list(Operation.objects.values_list("pk", flat=True)) == [op.id]
    posts = [r for r in transport.sent if r.method == "POST"]
    assert len(posts) == 3
    assert posts[0].headers["Idempotency-Key"] == posts[1].headers["Idempotency-Key"]
    assert posts[2].headers["Idempotency-Key"] != posts[0].headers["Idempotency-Key"]


def test_what_is_refused_for_its_content_is_not_retried_and_is_typed(server):
    agent = factories.agent()
    task = factories.task(agent)
    transport = DropAfterForward(lambda request: False)
    console = _client(server, agent.token, transport)

    with pytest.raises(errors.UnknownTool) as caught:
        console.propose(task.pk, "no.such.tool", {}, step="x")
    assert caught.value.status == 400
    with pytest.raises(errors.NotFound):
        console.get_task("tsk_missing")
    assert len(transport.sent) == 2


class StreamTamper(httpx.BaseTransport):
    """The event stream's connections: the first is cut after a few chunks; while it is down
    events are written; the second forgets ``Last-Event-ID`` (the server replays everything
    already delivered) and is cut too; the rest pass."""

    def __init__(self, while_down) -> None:
        self.inner = httpx.HTTPTransport()
        self.while_down = while_down
        self.last_event_ids: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "text/event-stream" not in request.headers.get("Accept", ""):
            return self.inner.handle_request(request)
        n = len(self.last_event_ids)
        self.last_event_ids.append(request.headers.get("Last-Event-ID"))
        if n == 1:
            self.while_down()
            del request.headers["Last-Event-ID"]
        response = self.inner.handle_request(request)
        if n < 2:
            assert isinstance(response.stream, httpx.SyncByteStream)
            response.stream = CutStream(response.stream, keep=2)
        return response


def test_the_event_stream_resumes_after_a_cut_missing_nothing_and_repeating_nothing(server):
    agent = factories.agent()
    task = factories.task(agent)
    for i in range(5):
        journal_note(task.pk, f"before-{i}")
    transport = StreamTamper(lambda: [journal_note(task.pk, f"gap-{i}") for i in range(3)])
    console = _client(server, agent.token, transport)

    got: list[str] = []
    for event in console.iter_events(task.pk, timeout=60):
        got.append(event.id)
        if len(got) == 4:
            journal_note(task.pk, "while-streaming")
        if len(got) == Event.objects.filter(task_id=task.pk).count() and len(got) >= 10:
            break

    expected = [
        str(s)
        for s in Event.objects.filter(task_id=task.pk).order_by("seq").values_list("seq", flat=True)
    ]
    assert got == expected
    assert len(transport.last_event_ids) >= 3
    assert transport.last_event_ids[0] is None
    assert transport.last_event_ids[1] is not None  # resumed where the cut left it


def test_events_are_polled_with_after_when_no_stream_can_be_had(server):
    agent = factories.agent()
    task = factories.task(agent)
    journal_note(task.pk, "one")

    def no_stream(request: httpx.Request) -> httpx.Response:
        if "text/event-stream" in request.headers.get("Accept", ""):
            raise httpx.ConnectError("refused", request=request)
        return httpx.HTTPTransport().handle_request(request)

    console = _client(server, agent.token, httpx.MockTransport(no_stream))
    seen = []
    for event in console.iter_events(task.pk, timeout=60, poll_interval=0.05):
        seen.append(event.id)
        if len(seen) == 1:
            journal_note(task.pk, "two")
        if len(seen) == Event.objects.filter(task_id=task.pk).count() and "two" in str(event.data):
            break
    expected = Event.objects.filter(task_id=task.pk).order_by("seq").values_list("seq", flat=True)
    assert seen == [str(s) for s in expected]


def test_the_lease_stops_on_stale_lease_and_never_reports_after_it(short_lease_server, caplog):
    caplog.set_level(logging.DEBUG, logger="agent_console_client")
    agent = factories.agent()
    task = factories.task(agent)
    op = factories.operation(agent, task, step="by-hand", executor="agent")
    gate = Gate(lambda r: r.url.path.endswith("/heartbeat"))
    console = _client(short_lease_server, agent.token, gate)

    with console.claim(op.pk, heartbeat_every=0.2) as lease:
        assert lease.grant is not None
        secret = lease.grant.lease_token.get_secret_value()
        assert secret and secret not in repr(lease) and secret not in repr(lease.grant)
        gate.held.wait(30)
        # The held heartbeat reaches the server only after the lease lapsed (on its clock) and
        # another execution took the operation over.
        wait_for(
            lambda: Operation.objects.filter(pk=op.pk, lease_expires_at__lt=Now()).exists(),
            what="the 2-second lease to lapse",
        )
        sweep_once()  # the sweeper finds the lapsed lease: the operation may be claimed again
        with _client(short_lease_server, agent.token).claim(op.pk) as takeover:
            assert takeover.grant is not None
            assert takeover.grant.lease_generation > lease.grant.lease_generation
            gate.release.set()
            wait_for(lambda: lease.lost, what="the heartbeat to meet stale_lease")
            beat = lease._beat._thread  # the heartbeat thread (agent_console_client._concurrency)
            assert beat is not None
            beat.join(10)
            assert not beat.is_alive()
            with pytest.raises(errors.StaleLease):
                lease.complete(result={"late": True})
            takeover.complete(result={"by": "takeover"})

    heartbeats = [r for r in gate.sent if r.url.path.endswith("/heartbeat")]
    assert len(heartbeats) == 1  # stopped at the first stale answer
    assert not [r for r in gate.sent if r.url.path.endswith("/complete")]
    assert Operation.objects.get(pk=op.pk).result == {"by": "takeover"}
    assert secret not in caplog.text


def test_a_complete_refused_as_stale_is_sent_once(short_lease_server):
    agent = factories.agent()
    task = factories.task(agent)
    op = factories.operation(agent, task, step="slow-hand", executor="agent")
    transport = DropAfterForward(lambda request: False)
    console = _client(short_lease_server, agent.token, transport)

    with console.claim(op.pk, heartbeat_every=3600) as lease:
        wait_for(
            lambda: Operation.objects.filter(pk=op.pk, lease_expires_at__lt=Now()).exists(),
            what="the 2-second lease to lapse",
        )
        sweep_once()
        _client(short_lease_server, agent.token).claim(op.pk).__enter__().stop()
        with pytest.raises(errors.StaleLease):
            lease.complete(result={"late": True})
        assert lease.lost
        with pytest.raises(errors.StaleLease):
            lease.complete(result={"late": True})
    completes = [r for r in transport.sent if r.url.path.endswith("/complete")]
    assert len(completes) == 1  # refused once, never sent again
    assert Operation.objects.get(pk=op.pk).status == "running"  # the new holder's


def test_a_lease_surfaces_cancel_requested_and_completes(server):
    agent = factories.agent()
    task = factories.task(agent)
    op = factories.operation(agent, task, step="cancel-me", executor="agent")
    console = _client(server, agent.token)
    told = []

    with console.claim(op.pk, heartbeat_every=0.1, on_cancel=lambda: told.append(1)) as lease:
        console.cancel_task(task.pk, "operator changed their mind")
        wait_for(lambda: lease.cancel_requested, what="a heartbeat to report the cancel")
        lease.complete("failed", error={"kind": "permanent", "message": "cancelled"})
    assert told == [1]


def test_the_async_client_proposes_runs_its_own_operation_and_reads_the_budget(server):
    agent = factories.agent()

    async def journey() -> tuple[str, str, float]:
        async with AsyncClient(base_url=server.url, token=agent.token, retry=FAST) as console:
            task = await console.create_task("async", budget={"tool_calls": 10})
            op = await console.propose(task.id, "demo.echo", {"x": 1}, step="s", executor="agent")
            async with console.claim(op.id) as lease:
                await lease.complete(result={"x": 1}, usage={"tool_calls": 1})
            done = await console.wait_operation(op.id, timeout=30)
            budget = await console.get_budget(task.id)
            return done.status, str(done.result), budget.meters["tool_calls"].posted

    assert asyncio.run(journey()) == ("succeeded", "{'x': 1}", 1.0)
