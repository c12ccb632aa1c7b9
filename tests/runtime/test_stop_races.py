"""A stop racing the writers around it (issue 21: R1, R2, R3, R7, R8, R8b). Every writer locks
in the global order (operation rows in ascending id, then the task row), reads the task under
its lock and applies the stop rule there (runtime.stoprule); a stop never turns a call whose
effect nobody confirmed into ``cancelled``: such work goes to a person, its budget hold stays
unknown until that person resolves it. Real concurrent transactions, stopped at named crash
points; lock waits observed in pg_stat_activity (Absurd style)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from runtime.cancellation import task_cancel
from runtime.executions import execution_for_agent
from runtime.models import BudgetHold, Event, Invocation, Operation, OutboxMessage, Task
from runtime.resolutions import operation_resolve, unresolved_queue
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_batch import operations_report_batch
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_batch import operations_claim_batch
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories
from tests.concurrency import gate_at, in_thread, lock_waiters, wait_until_blocked_on_a_lock
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]
postgres = pytest.mark.postgres

CHARGE = {"tool": "demo.payments.charge", "params": {"account": "acct-1", "amount_cents": 500}}


def _worker() -> str:
    return execution_for_agent("worker").pk


def _charge(owner, task, **spec) -> Operation:
    return factories.operation(owner, task, **{**CHARGE, **spec})


def _claimed_charge(owner, task, **spec) -> tuple[Operation, Lease]:
    op = _charge(owner, task, **spec)
    lease = operation_claim(op.pk, execution_id=_worker())
    assert isinstance(lease, Lease)
    return op, lease


def _report(op: Operation, lease: Lease, report: Report, snapshot: bool = False) -> Operation:
    return operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=report,
        execution_id=None,
        snapshot=lease.operation if snapshot else None,
    )


UNKNOWN = Report(outcome="unknown", message="the charge's answer was lost")


def _assert_with_a_person(op: Operation, task_id: str) -> None:
    """The charge the receiver may hold is unresolved, not announced, on the support queue; the
    task ended cancelled."""
    op.refresh_from_db()
    assert op.status == "unresolved", (op.status, op.status_reason)
    assert not OutboxMessage.objects.filter(operation=op).exists()
    support = factories.console_user("support")
    assert op.pk in {o.pk for o in unresolved_queue(support.actor)}
    task = Task.objects.get(pk=task_id)
    assert (task.condition, task.outcome, task.cancellation) == (
        "terminal",
        "cancelled",
        "quiescent",
    )
    # A late delivery claims nothing and settles nothing.
    assert isinstance(operation_claim(op.pk, execution_id=_worker()), Refusal)
    assert Operation.objects.get(pk=op.pk).status == "unresolved"


def _cancel_when_blocked_or_done(owner, task_id: str):
    """Start a cancel in its own thread and return once it is waiting for a row lock or done."""
    thread, future = in_thread(lambda: task_cancel(owner.actor, task_id, "stop"), "stop")
    wait_for(lambda: future.done() or lock_waiters() >= 1, what="the cancel to block or finish")
    return thread, future


# --- R1: the sweeper's takeover decides under the task's lock --------------------------------


@postgres
def test_a_cancel_committed_inside_the_sweepers_window_leaves_the_charge_with_a_person():
    """R1: the sweeper has read an expired lease; a cancel commits before it takes it over. The
    takeover reads the task under its lock and sees the stop: the lost charge goes to a person,
    never back to ``pending`` (whose next delivery would settle it ``cancelled``)."""
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _claimed_charge(owner, task)
    late = lease.lease_expires_at + timedelta(seconds=1)

    with gate_at("sweep.after_read", "sweeper") as gate:
        sweeper, swept = in_thread(lambda: lease_expire_sweep(now=late), "sweeper")
        assert gate.reached.wait(30), "the sweeper never read the expired lease"
        task_cancel(owner.actor, task.pk, "stop")  # commits inside the window
        gate.release()
        sweeper.join(30)

    assert swept.result(timeout=1) == 1
    assert Invocation.objects.get(operation=op).outcome == "lost"
    _assert_with_a_person(op, task.pk)


@postgres
def test_a_cancel_waiting_for_a_takeover_settles_the_lost_charge_for_a_person():
    """R7 (``pending`` after a takeover): the sweeper holds the row it is handing back to
    ``pending``; a cancel waits for it, then finds pending work whose call was lost. It does not
    cancel it: the receiver may hold the charge."""
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _claimed_charge(owner, task)
    late = lease.lease_expires_at + timedelta(seconds=1)

    with gate_at("operation.updated", "sweeper") as gate:
        sweeper, swept = in_thread(lambda: lease_expire_sweep(now=late), "sweeper")
        assert gate.reached.wait(30), "the sweeper never took the lease over"
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        wait_until_blocked_on_a_lock("the cancel to wait for the sweeper's rows")
        gate.release()
        sweeper.join(30)
        stopper.join(30)

    assert swept.result(timeout=1) == 1
    stopped.result(timeout=1)
    _assert_with_a_person(op, task.pk)
    assert Event.objects.filter(operation=op, type="operation.stopped_unconfirmed").exists()


# --- R2: the general acceptance decides "stopping" under the task's lock ----------------------


@postgres
def test_an_unknown_charge_outcome_racing_a_cancel_goes_to_a_person(settings):
    """R2: the acceptance has read the operation when a cancel commits. Deciding from the task
    read under its lock, it does not schedule a retry of the charge (which the retry's claim
    would then settle ``cancelled``): the outcome goes to a person."""
    settings.HOTPATH = False  # the general acceptance (SQLite's, and the statement's fallback)
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _claimed_charge(owner, task)

    with gate_at("report.after_read", "reporter") as gate:
        reporter, reported = in_thread(lambda: _report(op, lease, UNKNOWN), "reporter")
        assert gate.reached.wait(30), "the acceptance never read the operation"
        task_cancel(owner.actor, task.pk, "stop")  # commits inside the window
        gate.release()
        reporter.join(30)

    reported.result(timeout=1)
    assert Invocation.objects.get(operation=op).outcome == "unknown"
    _assert_with_a_person(op, task.pk)


@postgres
@pytest.mark.parametrize("hotpath", [False, True], ids=["general", "statement"])
def test_a_cancel_waiting_for_a_retry_of_an_unknown_charge_hands_it_to_a_person(hotpath, settings):
    """R7 (``retry_scheduled`` after ``unknown``): the acceptance holds the row while it
    schedules the retry; the cancel waits for it, then finds a retry whose call is unconfirmed,
    and hands it to a person instead of cancelling it."""
    settings.HOTPATH = hotpath
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _claimed_charge(owner, task)
    point = "operation.updated" if not hotpath else "report.before_commit"

    with gate_at(point, "reporter") as gate:
        reporter, reported = in_thread(
            lambda: _report(op, lease, UNKNOWN, snapshot=True), "reporter"
        )
        assert gate.reached.wait(30), "the acceptance never wrote the operation"
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        wait_until_blocked_on_a_lock("the cancel to wait for the acceptance's rows")
        gate.release()
        reporter.join(30)
        stopper.join(30)

    assert reported.result(timeout=1).status == "retry_scheduled"
    stopped.result(timeout=1)
    _assert_with_a_person(op, task.pk)


# --- R7: both orders of one history end the same -----------------------------------------------


@pytest.mark.parametrize("order", ["unknown_then_cancel", "cancel_then_unknown"])
def test_a_stop_never_turns_an_unconfirmed_charge_into_cancelled(order):
    """R7, on both databases: an unknown charge outcome and a cancel, in either order, end the
    same: the charge unresolved with its evidence, its budget hold unknown (visible) until a
    person resolves it, the task's ending (cancelled) standing after that resolution."""
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 1000})
    op, lease = _claimed_charge(owner, task, estimate={"cost_cents": 500})
    if order == "unknown_then_cancel":
        assert _report(op, lease, UNKNOWN).status == "retry_scheduled"
        task_cancel(owner.actor, task.pk, "stop")
    else:
        task_cancel(owner.actor, task.pk, "stop")
        _report(op, lease, UNKNOWN)

    _assert_with_a_person(op, task.pk)
    assert Invocation.objects.get(operation=op).outcome == "unknown"  # the evidence
    hold = BudgetHold.objects.get(operation=op)
    assert (hold.status, hold.amount) == ("unknown", 500)

    support = factories.console_user("support")
    op.refresh_from_db()
    operation_resolve(
        support.actor,
        op.pk,
        resolution="succeeded",
        evidence="the receiver shows charge ch_1",
        state_version=op.state_version,
    )
    hold.refresh_from_db()
    assert hold.status == "settled"
    task = Task.objects.get(pk=task.pk)
    assert (task.condition, task.outcome) == ("terminal", "cancelled")


# --- R3: retry_same_key decides under the task's lock -----------------------------------------


def _unresolved_charge(owner, task) -> Operation:
    """A charge out of attempts with its outcome unknown: unresolved, for a person."""
    op, lease = _claimed_charge(owner, task, max_attempts=1)
    assert _report(op, lease, UNKNOWN).status == "unresolved"
    op.refresh_from_db()
    return op


def test_a_retry_resolution_racing_a_cancel_is_refused_once_the_task_stopped():
    """R3, on both databases: a person asks for a retry under the same key; the cancel commits
    (and ends the task: nothing is active) after the request passed its checks. The retry is
    decided under the task's lock: 409 ``task_cancelled``, nothing re-pended or announced."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = _unresolved_charge(owner, task)

    def resolve() -> tuple[int, str]:
        response = support.client().post(
            f"/api/v1/operations/{op.pk}/resolve",
            {"resolution": "retry_same_key", "evidence": "", "state_version": op.state_version},
            format="json",
            HTTP_IDEMPOTENCY_KEY="retry-1",
        )
        body = response.json()
        return response.status_code, body["error"]["code"] if response.status_code >= 400 else ""

    with gate_at("resolve.before_lock", "support") as gate:
        resolver, resolved = in_thread(resolve, "support")
        assert gate.reached.wait(30), "the resolution never passed its checks"
        task_cancel(owner.actor, task.pk, "stop")  # commits inside the window
        gate.release()
        resolver.join(30)

    assert resolved.result(timeout=1) == (409, "task_cancelled")
    op.refresh_from_db()
    assert op.status == "unresolved"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    task = Task.objects.get(pk=task.pk)
    assert (task.condition, task.outcome) == ("terminal", "cancelled")


# --- R8: the cancel locks what it updates, before the task ------------------------------------


@postgres
def test_a_cancel_never_updates_work_claimed_between_its_locks(settings):
    """R8: the cancel has locked the task's live operations; new work is proposed and claimed
    before it locks the task, and its report holds the new row. The cancel must not update that
    row while it holds the task's (the report waits for the task: ``deadlock detected``). It
    takes its locks again with the new row first, waits for the report, and both commit."""
    settings.HOTPATH = False  # the report's window between its operation and task locks
    owner = factories.agent()
    task = factories.task(owner)

    with gate_at("cancel.after_lock", "stop") as stop_gate:
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        assert stop_gate.reached.wait(30), "the cancel never locked the operations"
        # Claimed between the cancel's two lock statements.
        op, lease = _claimed_charge(owner, task)
        with gate_at("operation.updated", "reporter") as report_gate:
            reporter, reported = in_thread(
                lambda: _report(op, lease, Report(outcome="succeeded", result={"id": "ch_1"})),
                "reporter",
            )
            assert report_gate.reached.wait(30), "the report never locked its operation"
            stop_gate.release()
            wait_until_blocked_on_a_lock("the cancel to wait for the report's rows")
            report_gate.release()
            reporter.join(30)
            stopper.join(30)

    assert reported.result(timeout=1).status == "succeeded"  # raises a deadlock, if any
    stopped.result(timeout=1)
    op.refresh_from_db()
    assert (op.status, op.result) == ("succeeded", {"id": "ch_1"})
    task = Task.objects.get(pk=task.pk)
    assert (task.condition, task.outcome) == ("terminal", "cancelled")


def _batch_claimed(owner, task) -> tuple[Operation, Lease]:
    op = factories.operation(owner, task, params={"v": 1})  # demo.echo: a quick call
    batch = operations_claim_batch(
        [op.pk], [f"{op.tool}:{op.tool_version}"], execution_id=_worker()
    )
    assert [lease.operation_id for lease in batch.leases] == [op.pk]
    return op, batch.leases[0]


def _batch_report(lease: Lease) -> dict[str, str]:
    return operations_report_batch(
        [(lease.operation, Report(outcome="succeeded", result={"v": 1}))],
        lease_token=lease.lease_token,
        execution_id=_worker(),
    )


@postgres
def test_a_cancel_never_updates_work_a_batch_acceptance_holds():
    """R8b: the cancel holds the task row (settling pending work) when a drainer's batch
    acceptance of work claimed between the cancel's lock statements starts. The batch must not
    hold that work's row while the cancel wants it (``deadlock detected``, and the batch stays
    running until its leases expire): the cancel locked it before the task, the batch waits,
    then finds the task stopping and settles on the one-operation path."""
    owner = factories.agent()
    task = factories.task(owner)
    waiting = factories.operation(owner, task, params={"v": 0})  # settled by the cancel

    with (
        gate_at("cancel.after_lock", "stop") as lock_gate,
        gate_at("operation.updated", "stop") as settle_gate,
    ):
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        assert lock_gate.reached.wait(30), "the cancel never locked the operations"
        op, lease = _batch_claimed(owner, task)  # between the cancel's two lock statements
        lock_gate.release()
        assert settle_gate.reached.wait(30), "the cancel never settled the waiting work"
        reporter, reported = in_thread(lambda: _batch_report(lease), "reporter")
        wait_until_blocked_on_a_lock("the batch acceptance to wait for the cancel's rows")
        settle_gate.release()
        stopper.join(30)
        reporter.join(30)

    stopped.result(timeout=1)  # raises a deadlock, if any
    assert reported.result(timeout=1) == {op.pk: "succeeded"}
    op.refresh_from_db()
    assert op.status == "succeeded"  # the result arrived after the request: kept
    assert Operation.objects.get(pk=waiting.pk).status == "cancelled"
    task = Task.objects.get(pk=task.pk)
    assert (task.condition, task.outcome) == ("terminal", "cancelled")


@postgres
def test_a_batch_acceptance_that_loses_a_deadlock_is_retried():
    """R8b: contention the database breaks by rolling the batch back is retried, as the
    one-operation path's is, instead of leaving the batch running until its leases expire. A
    transaction holding the task row asks for the batch's operation row while the batch waits
    for the task: PostgreSQL picks the batch (its deadlock check runs first) as the victim."""
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _batch_claimed(owner, task)
    has_task, close_cycle = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET LOCAL deadlock_timeout = '30s'")  # the batch checks first
            Task.objects.select_for_update().get(pk=task.pk)
            has_task.set()
            assert close_cycle.wait(30)
            list(Operation.objects.select_for_update().filter(pk=op.pk))

    holding, held = in_thread(holder, "holder")
    assert has_task.wait(30)
    reporter, reported = in_thread(lambda: _batch_report(lease), "reporter")
    wait_until_blocked_on_a_lock("the batch acceptance to wait for the task row")
    close_cycle.set()
    holding.join(60)
    reporter.join(60)

    held.result(timeout=1)
    assert reported.result(timeout=1) == {op.pk: "succeeded"}
    assert Operation.objects.get(pk=op.pk).status == "succeeded"
