"""Slow tools side by side in a worker process (issue 36 point 4, runtime.slots), with real
worker processes and PostgreSQL: a call of a tool that waits (``io_bound``, or an ``async def``
invoke) is claimed by its Celery delivery as any call is, then made in one of the process's
slots, under its own lease, cancel watch and fenced acceptance.

- One process makes twenty calls side by side: every one has started at the receiver before any
  finishes (``demo.slow_wait``'s barrier: each waits until twenty calls of its task started).
- A process killed with a hundred calls in its slots loses none and repeats no effect: the
  sweeper (its clock moved, no sleep) takes every lease over, and each call's effect is
  recorded once, under the newer lease.
- A cancel that a call in a slot ignores settles it after the grace period, and ends neither
  the process nor the other calls in it; an ``async def`` call is cancelled in its loop.
- A slot whose lease was taken over reports late: refused by fencing, nothing overwritten.
- A tool class's concurrency limit holds for calls in slots (admission is the claim's).
- Quick and CPU-bound tools keep their path: made by the delivery itself, never in a slot."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import slots
from runtime.cancellation import task_cancel
from runtime.drainers import call_drained_singly, call_quick
from runtime.executions import execution_current
from runtime.executor import IN_SLOT, operation_deliver
from runtime.models import (
    Event,
    Execution,
    Invocation,
    Operation,
    OutboxMessage,
    RejectedObservation,
)
from runtime.outbox import outbox_publish
from runtime.sandbox.models import SlowCall
from runtime.tools import base, loading
from runtime.transitions.lease import lease_expire_sweep
from tests import factories
from tests.concurrency import in_thread
from tests.conftest import wait_for
from tests.sqlcount import statements

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ENV = {"LEASE_SECONDS": 30, "SWEEP_SECONDS": 1, "OUTBOX_GRACE_SECONDS": 2}


def _ids(ops: list[Operation]) -> list[str]:
    return [o.pk for o in ops]


def _all(ops: list[Operation], status: str) -> bool:
    return Operation.objects.filter(pk__in=_ids(ops), status=status).count() == len(ops)


def _started(ops: list[Operation]) -> int:
    return SlowCall.objects.filter(key__in=[o.idempotency_key for o in ops]).count()


def _take_over(ops: list[Operation]) -> int:
    """The sweeper's takeover of the calls' leases with its clock moved past them (no sleep),
    and the announcements it wrote published now rather than at that moved time."""
    taken = lease_expire_sweep(now=timezone.now() + timedelta(seconds=ENV["LEASE_SECONDS"] + 1))
    due = OutboxMessage.objects.filter(operation_id__in=_ids(ops))
    due.update(available_at=timezone.now())
    outbox_publish(list(due))
    return taken


def _max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    points = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    running = peak = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        running += delta
        peak = max(peak, running)
    return peak


@pytest.mark.workers
def test_one_worker_process_makes_twenty_slow_calls_side_by_side(workers):
    (worker,) = workers.start(count=1, concurrency=1, **ENV)
    owner = factories.agent()
    task = factories.task(owner)
    # Each call waits until twenty calls of its task started at the receiver (or 60 s).
    ops = [
        factories.operation(
            owner, task, tool="demo.slow_wait", params={"seconds": 60, "wait_for": 20, "n": i}
        )
        for i in range(20)
    ]
    wait_for(lambda: _all(ops, "succeeded"), timeout=50, what=f"the calls:\n{worker.tail()}")

    calls = list(SlowCall.objects.filter(key__in=[o.idempotency_key for o in ops]))
    assert len(calls) == 20
    # Every call started before any finished: twenty at once in one process.
    assert max(c.started_at for c in calls) < min(c.finished_at for c in calls)
    executions = set(Invocation.objects.filter(operation__in=ops).values_list("execution_id"))
    assert len(executions) == 1
    (pid,) = Execution.objects.filter(pk__in=[e for (e,) in executions]).values_list("pid")
    assert pid[0] in worker.children()
    for op in Operation.objects.filter(pk__in=_ids(ops)):
        assert op.lease_generation == 1
        assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1


@pytest.mark.workers
def test_a_worker_killed_with_a_hundred_slow_calls_in_flight_loses_none_repeats_none(workers):
    (worker,) = workers.start(count=1, concurrency=1, **ENV)
    owner = factories.agent()
    task = factories.task(owner)
    # The first calls wait for 200 starts (never reached before the kill); the calls made again
    # after the takeover bring the count to 200, and end.
    ops = [
        factories.operation(
            owner, task, tool="demo.slow_wait", params={"seconds": 110, "wait_for": 200, "n": i}
        )
        for i in range(100)
    ]
    wait_for(lambda: _started(ops) == 100, timeout=60, what=f"100 starts:\n{worker.tail()}")
    assert _all(ops, "running")
    killed = worker.kill_children()
    assert killed

    assert _take_over(ops) == 100
    wait_for(lambda: _all(ops, "succeeded"), timeout=90, what=f"recovery:\n{worker.tail()}")

    for op in Operation.objects.filter(pk__in=_ids(ops)):
        assert op.lease_generation == 2
        outcomes = list(
            Invocation.objects.filter(operation=op)
            .order_by("number")
            .values_list("number", "lease_generation", "outcome")
        )
        assert outcomes == [(1, 1, "lost"), (2, 2, "succeeded")]
        assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
        # The receiver's record: one finished call per key, the newer lease's, and the result
        # names it; the killed call never finished.
        calls = list(SlowCall.objects.filter(key=op.idempotency_key))
        finished = [c for c in calls if c.finished_at is not None]
        assert [(c.fencing_token, c.pk) for c in finished] == [(2, op.result["call"])]
        assert sorted(c.fencing_token for c in calls) == [1, 2]
    # The new generation was made by another process (the worker started a new child).
    assert not Execution.objects.filter(
        pk__in=Invocation.objects.filter(operation__in=ops, number=2).values("execution_id"),
        pid__in=killed,
    ).exists()


@pytest.mark.workers
def test_a_worker_stopped_with_calls_in_its_slots_reports_them_before_it_exits(workers):
    (worker,) = workers.start(count=1, concurrency=1, **ENV)
    owner = factories.agent()
    task = factories.task(owner)
    ops = [
        factories.operation(owner, task, tool="demo.slow_wait", params={"seconds": 3, "n": i})
        for i in range(5)
    ]
    wait_for(lambda: _started(ops) == 5, timeout=60, what=worker.tail())
    # A warm shutdown (SIGTERM): the Celery tasks returned long ago, the calls are in slots.
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(timeout=60)
    for op in Operation.objects.filter(pk__in=_ids(ops)):
        assert (op.status, op.lease_generation) == ("succeeded", 1)


@pytest.mark.workers
def test_a_cancel_that_a_call_in_a_slot_ignores_settles_it_and_spares_the_others(workers):
    (worker,) = workers.start(count=1, concurrency=1, CANCEL_GRACE_SECONDS=0.5, **ENV)
    owner = factories.agent()
    stopped, going = factories.task(owner, "stopped"), factories.task(owner, "going")
    victim = factories.operation(owner, stopped, tool="demo.slow_wait", params={"seconds": 110})
    other = factories.operation(
        owner, going, tool="demo.slow_wait", params={"seconds": 110, "wait_for": 2}
    )
    wait_for(lambda: _started([victim, other]) == 2, timeout=60, what=worker.tail())
    child = worker.children()

    task_cancel(owner.actor, stopped.pk, "stop now")
    wait_for(
        lambda: Operation.objects.get(pk=victim.pk).status == "cancelled",
        timeout=60,
        what=f"the worker to settle the call:\n{worker.tail()}",
    )
    victim.refresh_from_db()
    assert victim.error["kind"] == "terminated"
    assert Invocation.objects.get(operation=victim).outcome == "terminated"
    stopped.refresh_from_db()
    assert (stopped.cancellation, stopped.outcome) == ("quiescent", "cancelled")

    # The process was not ended: the other call in it goes on, and ends once a second call of
    # its task starts beside it, in the same process.
    second = factories.operation(
        owner, going, tool="demo.slow_wait", params={"seconds": 110, "wait_for": 2}
    )
    wait_for(lambda: _all([other, second], "succeeded"), timeout=60, what=worker.tail())
    assert worker.children() == child
    made_by = set(
        Invocation.objects.filter(operation__in=[victim, other, second]).values_list(
            "execution__pid", flat=True
        )
    )
    assert made_by == set(child)
    # The call left in its thread never reported (its slot is still taken by it).
    assert SlowCall.objects.get(key=victim.idempotency_key).finished_at is None


@pytest.mark.workers
def test_a_slot_whose_lease_was_taken_over_reports_late_and_is_refused(workers):
    (worker,) = workers.start(count=1, concurrency=1, **ENV)
    owner = factories.agent()
    task = factories.task(owner)
    # The first call ends only once a second call of its task started: the one made again
    # after its lease is taken over.
    op = factories.operation(
        owner, task, tool="demo.slow_wait", params={"seconds": 110, "wait_for": 2}
    )
    wait_for(lambda: _started([op]) == 1, timeout=60, what=worker.tail())

    assert _take_over([op]) == 1
    wait_for(
        lambda: RejectedObservation.objects.filter(operation=op, kind="stale_completion").exists(),
        timeout=60,
        what=f"the late report:\n{worker.tail()}",
    )
    wait_for(lambda: Operation.objects.get(pk=op.pk).status == "succeeded", timeout=60)
    op.refresh_from_db()
    assert op.lease_generation == 2
    refused = RejectedObservation.objects.get(operation=op, kind="stale_completion")
    assert refused.lease_generation == 1
    # Both calls finished at the receiver; the accepted result is the newer lease's.
    calls = {c.fencing_token: c for c in SlowCall.objects.filter(key=op.idempotency_key)}
    assert sorted(calls) == [1, 2]
    assert all(c.finished_at is not None for c in calls.values())
    assert op.result["call"] == calls[2].pk
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    # Both generations were made by the one process, side by side.
    assert len(set(Invocation.objects.filter(operation=op).values_list("execution_id"))) == 1


@pytest.mark.workers
def test_a_tool_class_limit_holds_for_calls_in_slots(workers):
    (worker,) = workers.start(count=1, concurrency=1, TOOL_CONCURRENCY="demo.slow_wait=2", **ENV)
    owner = factories.agent()
    task = factories.task(owner)
    ops = [
        factories.operation(owner, task, tool="demo.slow_wait", params={"seconds": 1, "n": i})
        for i in range(6)
    ]
    wait_for(lambda: _all(ops, "succeeded"), timeout=120, what=worker.tail())
    calls = list(SlowCall.objects.filter(key__in=[o.idempotency_key for o in ops]))
    intervals = [(c.started_at, c.finished_at) for c in calls]
    # One process, and the class's two places both used: never a third.
    assert _max_overlap(intervals) == 2  # type: ignore[arg-type]


ASYNC_TOOL = """
import asyncio
from pathlib import Path

from runtime.tools import Contract, ToolAdapter, ToolResult, register

LOG = Path({log!r})


def _note(line):
    with LOG.open("a") as fh:
        fh.write(line + "\\n")


class AsyncWait(ToolAdapter):
    name = "team.async_wait"
    description = "Waits in an event loop until `wait_for` calls started (a team's tool)."
    contract = Contract.PURE
    params_schema = {{
        "type": "object",
        "properties": {{"wait_for": {{"type": "integer"}}}},
        "required": ["wait_for"],
    }}

    async def invoke(self, ctx):
        _note("start " + ctx.idempotency_key)
        try:
            while LOG.read_text().count("start ") < ctx.params["wait_for"]:
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            _note("cancelled " + ctx.idempotency_key)
            raise
        _note("end " + ctx.idempotency_key)
        return ToolResult({{"key": ctx.idempotency_key}})


register(AsyncWait())
"""


@pytest.fixture
def async_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``team.async_wait`` (an ``async def`` invoke) loaded through TOOL_MODULES: in this
    process (on a copy of the registry, put back after) and in the workers' environment."""
    root = tmp_path / "team"
    root.mkdir()
    name = f"team_async_{uuid.uuid4().hex[:10]}"
    log = tmp_path / "async.log"
    log.write_text("")
    (root / f"{name}.py").write_text(textwrap.dedent(ASYNC_TOOL.format(log=str(log))))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_VISIBLE", {})
    monkeypatch.setattr(loading, "_ORIGINS", {})
    monkeypatch.setattr("django.conf.settings.TOOL_MODULES", [name])
    apps.get_app_config("runtime").ready()
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    yield {"env": {"PYTHONPATH": path, "TOOL_MODULES": name}, "log": log}
    for module in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[module]


@pytest.mark.workers
def test_async_tool_calls_run_side_by_side_and_an_ignored_cancel_cancels_the_coroutine(
    workers, async_tool
):
    log: Path = async_tool["log"]
    (worker,) = workers.start(
        count=1, concurrency=1, CANCEL_GRACE_SECONDS=0.5, **async_tool["env"], **ENV
    )
    owner = factories.agent()
    together, stopped = factories.task(owner, "together"), factories.task(owner, "stopped")
    # Three calls wait until four calls started; the fourth waits for ever, until cancelled.
    ops = [
        factories.operation(owner, together, tool="team.async_wait", params={"wait_for": 4})
        for _ in range(3)
    ]
    victim = factories.operation(owner, stopped, tool="team.async_wait", params={"wait_for": 99})
    wait_for(lambda: _all(ops, "succeeded"), timeout=60, what=f"the calls:\n{worker.tail()}")
    lines = log.read_text().split("\n")
    assert sum(line.startswith("start ") for line in lines) == 4
    child = worker.children()

    task_cancel(owner.actor, stopped.pk, "stop now")
    wait_for(
        lambda: Operation.objects.get(pk=victim.pk).status == "cancelled",
        timeout=60,
        what=f"the worker to settle the call:\n{worker.tail()}",
    )
    # The coroutine itself was cancelled (not left running), in a process that goes on.
    wait_for(
        lambda: f"cancelled {victim.idempotency_key}" in log.read_text(),
        timeout=30,
        what="the coroutine's cancellation",
    )
    assert f"end {victim.idempotency_key}" not in log.read_text()
    assert worker.children() == child
    pids = set(
        Invocation.objects.filter(operation__in=[*ops, victim]).values_list(
            "execution__pid", flat=True
        )
    )
    assert pids == set(child)


# --- in this process: the route a delivery takes ---------------------------------------------


@pytest.fixture
def process_slots(settings: Any) -> Iterator[None]:
    """This process given slots, as a worker process is at its start; stopped after."""
    settings.TOOL_SLOTS = 8
    settings.TOOL_SLOT_DB_POOL = 2
    slots.slots_start()
    try:
        yield
    finally:
        assert slots.slots_stop(timeout=60)


def _slot_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tool-slot_")]


def test_quick_and_cpu_bound_tools_keep_their_path(process_slots):
    owner = factories.agent()
    task = factories.task(owner)
    echo = factories.operation(owner, task, params={"n": 1})
    cpu = factories.operation(owner, task, tool="demo.slow", params={"seconds": 0})
    assert not _slot_threads()
    execution_current()
    # Made by the delivery itself, in this thread: no slot taken, no slot thread started, and
    # the statements of the one-operation path, no other (the claim, the acceptance).
    with CaptureQueriesContext(connection) as ctx:
        assert operation_deliver(echo.pk).outcome == "succeeded"
    assert len(statements(ctx)) == 2, statements(ctx)
    assert operation_deliver(cpu.pk).outcome == "succeeded"
    assert not _slot_threads()
    assert slots.slots_busy() == 0
    # They stay announced as before: a drainer may take them (quick, or one at a time); a call
    # that waits is never left to a drainer.
    assert call_quick("demo.echo", {"n": 1}) is True
    assert call_drained_singly("demo.slow", "tool") is True
    assert call_drained_singly("demo.slow_wait", "tool") is False
    assert call_quick("demo.slow_wait", {}) is False


def test_a_call_that_waits_is_handed_to_a_slot_which_writes_through_a_few_connections(
    process_slots,
):
    owner = factories.agent()
    task = factories.task(owner)
    execution_current()
    ops = [
        factories.operation(
            owner, task, tool="demo.slow_wait", params={"seconds": 60, "wait_for": 8, "n": i}
        )
        for i in range(8)
    ]
    # Each delivery returns once its call is claimed: the call is made in a slot.
    assert [operation_deliver(op.pk).outcome for op in ops] == [IN_SLOT] * 8
    wait_for(lambda: _all(ops, "succeeded"), timeout=50, what="the calls in slots")
    calls = list(SlowCall.objects.filter(key__in=[o.idempotency_key for o in ops]))
    assert max(c.started_at for c in calls) < min(c.finished_at for c in calls)
    # Eight calls waited at once through a pool of two connections: a slot holds one only
    # while it writes (the ninth place in the pool would have been needed otherwise).
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        (others,) = cur.fetchone()
    assert others <= 2
    assert len(_slot_threads()) == 8


def test_a_heartbeat_from_a_thread_a_tool_started_holds_no_connection_after_it(process_slots):
    """A tool in a slot may heartbeat from a thread of its own while its request blocks (the
    HTTP tools do): the statement takes a connection from the slots' pool and gives it back."""
    owner = factories.agent()
    task = factories.task(owner)
    execution_current()
    op = factories.operation(owner, task, tool="demo.slow_wait", params={"seconds": 3})
    assert operation_deliver(op.pk).outcome == IN_SLOT
    assert slots.slots_busy() == 1

    def beat() -> tuple[int, bool]:
        with slots.db_step(), connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            (pid,) = cur.fetchone()
        return pid, connection.connection is None

    thread, future = in_thread(beat, "tool-heartbeat")
    thread.join(timeout=30)
    pid, holds_none = future.result()
    assert holds_none  # its own connection was never opened, the pooled one went back
    with connection.cursor() as cur:
        cur.execute("SELECT application_name, state FROM pg_stat_activity WHERE pid = %s", [pid])
        assert cur.fetchone()[1] == "idle"  # still open: in the pool, for the next step
    wait_for(lambda: Operation.objects.get(pk=op.pk).status == "succeeded", timeout=30)


@pytest.fixture
def one_slot(settings: Any) -> Iterator[None]:
    settings.TOOL_SLOTS = 1
    settings.TOOL_SLOT_DB_POOL = 1
    slots.slots_start()
    try:
        yield
    finally:
        assert slots.slots_stop(timeout=60)


def test_with_every_slot_taken_the_delivery_makes_the_call_itself(one_slot):
    owner = factories.agent()
    task = factories.task(owner)
    execution_current()
    first, second = (
        factories.operation(
            owner, task, tool="demo.slow_wait", params={"seconds": 60, "wait_for": 2, "n": i}
        )
        for i in range(2)
    )
    assert operation_deliver(first.pk).outcome == IN_SLOT
    # The one slot is taken: this delivery makes its call here, beside the slot's (each waits
    # for the other to start), and returns its outcome, as a delivery of any call does.
    assert operation_deliver(second.pk).outcome == "succeeded"
    assert Invocation.objects.get(operation=second).outcome == "succeeded"
    wait_for(lambda: Operation.objects.get(pk=first.pk).status == "succeeded", timeout=50)
