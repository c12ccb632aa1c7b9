"""Admission control and stopping what does not listen, with real worker processes: a tool class
at its concurrency limit runs no more than N at once (observed at the receiver); a worker-run
call that ignores its cancel is ended by its worker after the grace period, and the task reaches
quiescence; the deadline's remaining time reaches the receiver."""

from __future__ import annotations

from datetime import datetime

import pytest

from runtime.cancellation import task_cancel
from runtime.models import Event, Invocation, Operation
from runtime.sandbox.models import SlowCall
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {"LEASE_SECONDS": 30, "SWEEP_SECONDS": 1, "OUTBOX_GRACE_SECONDS": 2}


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    points = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    running = peak = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        running += delta
        peak = max(peak, running)
    return peak


def test_a_tool_class_at_its_concurrency_limit_runs_no_more_than_n_at_once(workers):
    workers.start(count=1, concurrency=4, TOOL_CONCURRENCY="demo.slow=2", **FAST)
    owner = factories.agent()
    task = factories.task(owner)
    ops = [
        factories.operation(owner, task, tool="demo.slow", params={"seconds": 1.0, "n": i})
        for i in range(6)
    ]
    wait_for(
        lambda: (
            Operation.objects.filter(pk__in=[o.pk for o in ops], status="succeeded").count() == 6
        ),
        timeout=120,
        what="every slow call to finish",
    )
    calls = list(SlowCall.objects.filter(key__in=[o.idempotency_key for o in ops]))
    assert len(calls) == 6
    intervals = [(c.started_at, c.finished_at) for c in calls]
    assert all(end is not None for _, end in intervals)
    # Four worker processes were free; the receiver never saw more than two calls at once.
    assert max_overlap(intervals) <= 2  # type: ignore[arg-type]


def test_a_hung_call_that_ignores_its_cancel_is_ended_after_the_grace_period(workers):
    (worker,) = workers.start(count=1, concurrency=1, CANCEL_GRACE_SECONDS=1, **FAST)
    owner = factories.agent()
    task = factories.task(owner, deadline_seconds=600)
    op = factories.operation(owner, task, tool="demo.slow", params={"seconds": 110})
    call = wait_for(
        lambda: SlowCall.objects.filter(key=op.idempotency_key).first(),
        timeout=60,
        what="the slow call to reach its receiver",
    )
    # The deadline travelled with the call to the receiver.
    assert call.deadline_remaining is not None and 0 < call.deadline_remaining <= 600
    child = worker.children()
    task_cancel(owner.actor, task.pk, "stop now")

    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "cancelled",
        timeout=60,
        what="the worker to end the call",
    )
    op.refresh_from_db()
    assert op.error["kind"] == "terminated"
    task.refresh_from_db()
    assert (task.cancellation, task.outcome) == ("quiescent", "cancelled")
    inv = Invocation.objects.get(operation=op, number=1)
    assert inv.outcome == "terminated"
    ended = Event.objects.get(operation=op, type="operation.terminated")
    assert ended.actor.startswith("execution:")
    # The child process that ran it is gone (the worker starts a new one); the call never
    # finished at the receiver.
    wait_for(lambda: worker.children() and worker.children() != child, timeout=60, what="respawn")
    assert SlowCall.objects.get(pk=call.pk).finished_at is None


def test_a_completion_that_committed_before_the_stop_wins_and_says_so(workers):
    workers.start(count=1, concurrency=1, CANCEL_GRACE_SECONDS=30, **FAST)
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.slow", params={"seconds": 2})
    wait_for(
        lambda: SlowCall.objects.filter(key=op.idempotency_key).exists(),
        timeout=60,
        what="the slow call to start",
    )
    task_cancel(owner.actor, task.pk, "too late")
    wait_for(lambda: Operation.objects.get(pk=op.pk).status == "succeeded", timeout=60)
    done = Event.objects.get(operation=op, type="operation.succeeded")
    assert done.data["completed_after_cancel_request"] is True
    wait_for(lambda: factories_task_outcome(task.pk) == "cancelled", timeout=30)


def factories_task_outcome(task_id: str) -> str | None:
    from runtime.models import Task

    return Task.objects.get(pk=task_id).outcome


def test_a_hung_call_that_may_have_had_an_effect_goes_to_a_person_when_ended(workers):
    """The same watchdog on a call that is not pure: it may have charged, so ending it cannot
    say "cancelled". The operation goes to support staff (unresolved), its invocation is
    terminated, and its hold in the ledger becomes unknown, never free."""
    from runtime.models import BudgetMeter

    workers.start(count=1, concurrency=1, CANCEL_GRACE_SECONDS=1, **FAST)
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 10000})
    op = factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 500, "_fault": "hang"},
        estimate={"cost_cents": 500},
    )
    wait_for(
        lambda: Invocation.objects.filter(operation=op, number=1).exists(),
        timeout=60,
        what="the charge to start",
    )
    task_cancel(owner.actor, task.pk, "stop now")
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "unresolved",
        timeout=60,
        what="the watchdog to end the call",
    )
    assert Invocation.objects.get(operation=op, number=1).outcome == "terminated"
    meter = BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter="cost_cents")
    assert (meter.reserved, meter.unknown) == (0, 500)
