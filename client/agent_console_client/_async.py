"""The console client, written async over httpx; ``_sync.py`` is made from this file by unasync
(``make client``, client/generate.py), so the two cannot drift: edit this one. Where they differ
by more than ``async``/``await`` (sleeping, the heartbeat beside the caller) the code names the
async form of ``agent_console_client._concurrency``, which unasync turns into the sync one."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, TypeVar

import httpx

from agent_console_client import _core, errors
from agent_console_client._concurrency import AsyncBeat, AsyncSleep, async_sleep
from agent_console_client._generated._async.routes import AsyncRoutes
from agent_console_client.models import (
    TERMINAL_STATUSES,
    Approval,
    Artifact,
    Budget,
    Event,
    HeartbeatAnswer,
    LeaseGrant,
    Operation,
    SignalAnswer,
    Task,
)

T = TypeVar("T")
log = logging.getLogger("agent_console_client")


class AsyncClient(AsyncRoutes):
    """A console client for one principal (an agent's or a script's bearer token).

    Every route of the API is a method (generated from docs/openapi.yaml: ``tasks_list``,
    ``iter_tasks_list``, ``tasks_pause``, ...) answering the typed models of
    ``agent_console_client.schema``; the verbs below are the hand-written conveniences.

    ``http`` injects the httpx client to use (its transport, proxies, limits); the caller keeps
    it and closes it. Without it the client makes and owns one (close it, or use ``with``).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: float = 30.0,
        retry: _core.RetryPolicy | None = None,
        sleep: AsyncSleep = async_sleep,
    ) -> None:
        self.base_url = _core.url(base_url)
        self._headers = _core.auth_headers(token)
        self._owns_http = http is None
        self.http = http if http is not None else httpx.AsyncClient(timeout=timeout)
        self.retry = retry or _core.RetryPolicy()
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- sending ---------------------------------------------------------------------------

    async def send(self, call: _core.Call[T]) -> T:
        """Send one logical call, retrying as the policy says under the same Idempotency-Key."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self.http.request(
                    call.method,
                    self.base_url + call.path,
                    json=call.json,
                    params=call.params,
                    files=call.files,
                    data=call.data,
                    headers={**self._headers, **call.headers()},
                )
            except _core.RETRYABLE_EXCEPTIONS as exc:
                delay = self.retry.delay(attempt, None) if call.retry else None
                log.debug("%s %s failed (%s), retry in %s", call.method, call.path, exc, delay)
                if delay is None:
                    raise _core.transport_error(exc) from exc
                await self._sleep(delay)
                continue
            log.debug("%s %s -> %s", call.method, call.path, response.status_code)
            if response.is_success:
                return call.parse(response)
            delay = self.retry.delay(attempt, response) if call.retry else None
            if delay is None:
                raise _core.error_for(response)
            await self._sleep(delay)

    # --- tasks -----------------------------------------------------------------------------

    async def create_task(
        self,
        name: str,
        input: dict[str, Any] | None = None,
        *,
        deadline_seconds: int | None = None,
        budget: dict[str, float] | None = None,
        parent: str | None = None,
        required_checks: list[dict[str, Any]] | None = None,
        external_id: str | None = None,
    ) -> Task:
        """Create a task (``POST /tasks``); a retried create makes one task. Under an
        ``external_id`` (your own key, unique among your tasks) an existing task created with
        the same input is returned instead; other input is IdempotencyKeyReused."""
        return await self.send(
            _core.create_task(
                name,
                input,
                deadline_seconds=deadline_seconds,
                budget=budget,
                parent=parent,
                required_checks=required_checks,
                external_id=external_id,
            )
        )

    async def get_or_create_task(
        self,
        external_id: str,
        name: str,
        input: dict[str, Any] | None = None,
        *,
        deadline_seconds: int | None = None,
        budget: dict[str, float] | None = None,
        parent: str | None = None,
        required_checks: list[dict[str, Any]] | None = None,
    ) -> Task:
        """The task created under ``external_id``, created now if there is none: what a
        restarted agent calls to find its task again (the same input each time)."""
        return await self.send(
            _core.create_task(
                name,
                input,
                deadline_seconds=deadline_seconds,
                budget=budget,
                parent=parent,
                required_checks=required_checks,
                external_id=external_id,
            )
        )

    async def find_task(self, external_id: str) -> Task | None:
        """Your task created under ``external_id``, or None (``GET /tasks?external_id=``)."""
        return await self.send(_core.find_task(external_id))

    async def get_task(self, task_id: str) -> Task:
        return await self.send(_core.get_task(task_id))

    async def complete_task(self, task_id: str) -> Task:
        """Ask for success; CompletionRefused names the checks that did not pass."""
        return await self.send(_core.complete_task(task_id))

    async def cancel_task(self, task_id: str, reason: str) -> Task:
        return await self.send(_core.cancel_task(task_id, reason))

    async def send_signal(
        self, task_id: str, name: str, payload: Any, *, event_id: str
    ) -> SignalAnswer:
        return await self.send(_core.send_signal(task_id, name, payload, event_id))

    async def get_budget(self, task_id: str) -> Budget:
        return await self.send(_core.get_budget(task_id))

    async def upload_artifact(
        self, task_id: str, name: str, data: bytes, media_type: str = "application/octet-stream"
    ) -> Artifact:
        return await self.send(_core.upload_artifact(task_id, name, data, media_type))

    async def accept_artifact(self, artifact_id: str, expected_state_version: int) -> Artifact:
        return await self.send(_core.accept_artifact(artifact_id, expected_state_version))

    # --- operations ------------------------------------------------------------------------

    async def propose(
        self,
        task_id: str,
        tool: str,
        params: dict[str, Any] | None = None,
        *,
        step: str,
        intent_version: int | None = None,
        estimate: dict[str, float] | None = None,
        executor: str | None = None,
        max_attempts: int | None = None,
        approval_timeout_seconds: int | None = None,
        operation_key: str | None = None,
    ) -> Operation:
        """Propose an operation. The same task, step, tool and parameters give the same
        operation (the server derives its key from them), however often this is called."""
        return await self.send(
            _core.propose(
                task_id,
                tool,
                params,
                step=step,
                intent_version=intent_version,
                estimate=estimate,
                executor=executor,
                max_attempts=max_attempts,
                approval_timeout_seconds=approval_timeout_seconds,
                operation_key=operation_key,
            )
        )

    async def get_operation(self, operation_id: str) -> Operation:
        return await self.send(_core.get_operation(operation_id))

    async def wait_operation(
        self,
        operation_id: str,
        *,
        until: frozenset[str] | set[str] = TERMINAL_STATUSES,
        timeout: float | None = None,
    ) -> Operation:
        """Wait, following the task's events, until the operation's status is in ``until``;
        OperationTimeout after ``timeout`` seconds."""
        op = await self.get_operation(operation_id)
        if op.status in until:
            return op
        async for event in self.iter_events(op.task, timeout=timeout):
            if event.concerns(operation_id):
                op = await self.get_operation(operation_id)
                if op.status in until:
                    return op
        op = await self.get_operation(operation_id)
        if op.status in until:
            return op
        raise errors.OperationTimeout(
            f"operation {operation_id} still {op.status} after {timeout}s"
        )

    def claim(
        self,
        operation_id: str,
        *,
        heartbeat_every: float | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> AsyncLease:
        """A lease on an agent-executed operation, as a context manager: claims on enter,
        heartbeats at about a third of the lease, reports a failure if the block raises."""
        return AsyncLease(self, operation_id, heartbeat_every=heartbeat_every, on_cancel=on_cancel)

    # --- approvals (console users' tokens) -------------------------------------------------

    async def list_approvals(
        self, status: str | None = "pending", task: str | None = None
    ) -> list[Approval]:
        return await self.send(_core.list_approvals(status, task))

    async def get_approval(self, approval_id: str) -> Approval:
        return await self.send(_core.get_approval(approval_id))

    async def decide(
        self, approval_id: str, decision: str, *, reason: str = "", params_hash: str = ""
    ) -> Any:
        """Approve (with the ``params_hash`` seen) or deny (with a reason) an approval."""
        return await self.send(
            _core.decide(approval_id, decision, reason=reason, params_hash=params_hash)
        )

    async def edit_approval(
        self, approval_id: str, params: dict[str, Any], reason: str
    ) -> Approval:
        return await self.send(_core.edit_approval(approval_id, params, reason))

    # --- events ----------------------------------------------------------------------------

    async def iter_events(
        self,
        task_id: str,
        after: str | None = None,
        *,
        follow: bool = True,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        stream_seconds: float = 300.0,
    ) -> AsyncIterator[Event]:
        """The task's events strictly after ``after``, oldest first, each once.

        Following (the default) reads server-sent events and resumes a cut stream with
        ``Last-Event-ID``; ids already delivered are dropped; when the stream cannot be had it
        falls back to polling ``GET ?after=``. Without ``follow`` it pages to the end and stops.
        ``timeout`` ends the iteration (without error) after that many seconds."""
        cursor = _core.EventCursor(last=after)
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        streaming = follow
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            if not streaming:
                page = await self.send(_core.events_page(task_id, cursor.last))
                fresh = list(cursor.fresh(page.events))
                for event in fresh:
                    yield event
                if not page.events:
                    if not follow:
                        return
                    await self._sleep(
                        poll_interval if remaining is None else min(poll_interval, remaining)
                    )
                continue
            seconds = (
                stream_seconds if remaining is None else max(1.0, min(stream_seconds, remaining))
            )
            headers = {**self._headers, "Accept": "text/event-stream"}
            if cursor.last is not None:
                headers["Last-Event-ID"] = cursor.last
            timeouts = httpx.Timeout(self.http.timeout.connect, read=_core.STREAM_READ_TIMEOUT)
            try:
                async with self.http.stream(
                    "GET",
                    f"{self.base_url}{_core.API}/tasks/{task_id}/events",
                    headers=headers,
                    params={"max_seconds": seconds},
                    timeout=timeouts,
                ) as response:
                    if not _core.is_event_stream(response):
                        await response.aread()
                        if response.status_code in (401, 403, 404) or (
                            400 <= response.status_code < 500 and response.status_code != 406
                        ):
                            raise _core.error_for(response)
                        log.info("no event stream (%s): polling", response.status_code)
                        streaming = False
                        continue
                    failures = 0
                    parser = _core.SSEParser()
                    async for line in response.aiter_lines():
                        raw = parser.feed(line)
                        if raw is not None:
                            for event in cursor.fresh([_core.sse_event(raw)]):
                                yield event
                        if deadline is not None and time.monotonic() >= deadline:
                            return
            except _core.RETRYABLE_EXCEPTIONS as exc:
                failures += 1
                log.debug("event stream cut (%s); resuming after %s", exc, cursor.last)
                if failures >= _core.STREAM_FAILURES_BEFORE_POLLING:
                    log.info("event stream unavailable: polling")
                    streaming = False
                else:
                    await self._sleep(min(2.0, 0.1 * 2**failures))


class AsyncLease:
    """A claimed lease on an agent-executed operation, as a context manager (``with``).

    It heartbeats beside the caller at about a third of the lease. ``cancel_requested`` turns
    true when a heartbeat reports that the task is being cancelled (``on_cancel`` is then called
    once, from the heartbeat). ``lost`` turns true when the server answered ``stale_lease``:
    heartbeats stop, and ``complete`` raises StaleLease without sending anything. If the block
    raises, a failure is reported. The lease token never appears in ``repr`` or in logs."""

    def __init__(
        self,
        client: AsyncClient,
        operation_id: str,
        *,
        heartbeat_every: float | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.operation_id = operation_id
        self.grant: LeaseGrant | None = None
        self.cancel_requested = False
        self.lost = False
        self.completed: Operation | None = None
        self.heartbeats = 0
        self._every = heartbeat_every
        self._on_cancel = on_cancel
        self._beat = AsyncBeat()

    def __repr__(self) -> str:
        generation = self.grant.lease_generation if self.grant else None
        return (
            f"{type(self).__name__}(operation={self.operation_id!r}, generation={generation}, "
            f"lost={self.lost}, cancel_requested={self.cancel_requested})"
        )

    async def __aenter__(self) -> AsyncLease:
        grant: LeaseGrant = await self.client.send(_core.claim(self.operation_id))
        self.grant = grant
        every = _core.heartbeat_interval(grant, self._every)
        self._beat.start(self._beat_once, every, f"lease-{self.operation_id}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        if exc is not None and exc_type is not None and self.completed is None and not self.lost:
            message = f"{exc_type.__name__}: {exc}"[:500]
            try:
                await self.complete("failed", error={"kind": "transient", "message": message})
            except errors.ConsoleError as report_error:
                log.warning(
                    "could not report the failure of %s: %s", self.operation_id, report_error
                )

    async def stop(self) -> None:
        """Stop heartbeating (the lease then lapses unless completed)."""
        await self._beat.stop()

    async def heartbeat(self) -> HeartbeatAnswer:
        """One heartbeat now. StaleLease marks the lease lost, which stops heartbeating."""
        assert self.grant is not None, "claim first (enter the context manager)"
        if self.lost:
            raise errors.StaleLease("the lease was lost", code="stale_lease")
        try:
            answer = await self.client.send(_core.heartbeat(self.operation_id, self.grant))
        except errors.StaleLease:
            self.lost = True
            raise
        self.heartbeats += 1
        if answer.cancel_requested and not self.cancel_requested:
            self.cancel_requested = True
            if self._on_cancel is not None:
                self._on_cancel()
        return answer

    async def _beat_once(self) -> bool:
        """One background heartbeat; False ends them (the lease is lost)."""
        try:
            await self.heartbeat()
        except errors.StaleLease:
            log.warning("lease on %s is stale: stopped heartbeating", self.operation_id)
            return False
        except errors.ConsoleError as exc:
            log.warning("heartbeat for %s failed: %s", self.operation_id, exc)
        return True

    async def complete(
        self,
        outcome: str = "succeeded",
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        usage: dict[str, float] | None = None,
    ) -> Operation:
        """Report the outcome under the lease. Never retried after ``stale_lease`` (raised)."""
        assert self.grant is not None, "claim first (enter the context manager)"
        if self.lost:
            raise errors.StaleLease(
                "the lease was lost: the outcome was not reported", code="stale_lease"
            )
        await self.stop()
        try:
            completed: Operation = await self.client.send(
                _core.complete_operation(
                    self.operation_id, self.grant, outcome, result=result, error=error, usage=usage
                )
            )
        except errors.StaleLease:
            self.lost = True
            raise
        self.completed = completed
        return completed
