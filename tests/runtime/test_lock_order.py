"""One global lock order (operation rows in ascending id, then the task row) on every write path,
proven deterministically: one thread holds an operation row exactly where a transition has
locked it and not yet touched its task, a stop starts in another thread, PostgreSQL shows the
stop waiting for that lock, and then the first thread goes on. With the task locked first (the
old order) the two deadlock and one of them dies with ``deadlock detected``."""

from __future__ import annotations

import pytest

from runtime.cancellation import task_cancel, task_fail
from runtime.executions import execution_for_agent
from runtime.models import Event, Operation, Task
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STOPS = {"cancel": task_cancel, "fail": task_fail}


def _claimed(owner, **spec) -> tuple[Operation, Lease]:
    task = factories.task(owner)
    op = factories.operation(owner, task, **spec)
    lease = operation_claim(op.pk, execution_id=execution_for_agent("worker").pk)
    assert isinstance(lease, Lease)
    return op, lease


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stop_racing_a_report_waits_for_it_and_keeps_the_result(stop, settings):
    settings.HOTPATH = False  # the general path: a window between operation and task locks
    owner = factories.agent()
    op, lease = _claimed(owner, params={"v": 1})

    def report() -> Operation:
        return operation_report(
            op.pk,
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            state_version=lease.state_version,
            report=Report(outcome="succeeded", result={"v": 1}),
            execution_id=None,
        )

    with gate_at("operation.updated", "reporter") as gate:
        reporter, reported = in_thread(report, "reporter")
        assert gate.reached.wait(30), "the report never locked its operation"
        stopper, stopped = in_thread(lambda: STOPS[stop](owner.actor, op.task_id, "x"), "stop")
        wait_until_blocked_on_a_lock("the stop to wait for the reporter's operation row")
        gate.release()
        reporter.join(30)
        stopper.join(30)

    accepted = reported.result(timeout=1)  # raises the reporter's error, if any
    task = stopped.result(timeout=1)
    assert accepted.status == "succeeded"
    op.refresh_from_db()
    assert (op.status, op.result) == ("succeeded", {"v": 1})  # completion won, and is kept
    assert task.condition == "terminal"
    assert task.outcome == ("cancelled" if stop == "cancel" else "failed")


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stop_racing_a_claim_waits_then_asks_the_running_work_to_stop(stop, settings):
    settings.HOTPATH = False
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    execution = execution_for_agent("worker").pk

    with gate_at("operation.updated", "claimer") as gate:
        claimer, claimed = in_thread(
            lambda: operation_claim(op.pk, execution_id=execution), "claimer"
        )
        assert gate.reached.wait(30), "the claim never locked its operation"
        stopper, stopped = in_thread(lambda: STOPS[stop](owner.actor, task.pk, "x"), "stop")
        wait_until_blocked_on_a_lock("the stop to wait for the claimer's operation row")
        gate.release()
        claimer.join(30)
        stopper.join(30)

    lease = claimed.result(timeout=1)
    stopped.result(timeout=1)
    assert isinstance(lease, Lease)
    op.refresh_from_db()
    assert op.status == "running" and op.cancel_requested
    # The request to stop is journalled with who asked: it changes what the worker does.
    asked = Event.objects.get(operation=op, type="operation.cancel_requested")
    assert asked.actor == owner.actor.label

    # The worker stops and says so (a transient failure): nothing is retried for a stopped
    # task; the work is cancelled and the task reaches its end.
    operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="failed", error_kind="transient", message="stopped"),
        execution_id=execution,
    )
    _assert_stopped_and_quiet(op, task, stop)


def _assert_stopped_and_quiet(op: Operation, task, stop: str) -> None:
    op.refresh_from_db()
    assert op.status == "cancelled"
    task = Task.objects.get(pk=task.pk)
    assert task.condition == "terminal"
    if stop == "cancel":
        assert task.cancellation == "quiescent"


# --- the one-statement path: the stop holds the operation rows, the statement waits -----------


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_claim_statement_waits_for_a_stop_holding_the_operations_then_claims_nothing(stop):
    """The stop has locked the task's operations (first in the order) and not yet the task; the
    one-statement claim blocks on the operation row instead of taking the task row first."""
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    execution = execution_for_agent("worker").pk

    with gate_at("cancel.after_lock", "stop") as gate:
        stopper, stopped = in_thread(lambda: STOPS[stop](owner.actor, task.pk, "x"), "stop")
        assert gate.reached.wait(30), "the stop never locked the operations"
        claimer, claimed = in_thread(
            lambda: operation_claim(op.pk, execution_id=execution), "claimer"
        )
        wait_until_blocked_on_a_lock("the claim statement to wait for the stop's row lock")
        gate.release()
        stopper.join(30)
        claimer.join(30)

    stopped.result(timeout=1)
    assert not isinstance(claimed.result(timeout=1), Lease)
    op.refresh_from_db()
    assert (op.status, op.lease_generation) == ("cancelled", 0)


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_an_acceptance_statement_waits_for_a_stop_then_settles_for_it(stop):
    owner = factories.agent()
    op, lease = _claimed(owner, params={"v": 1})
    task = Task.objects.get(pk=op.task_id)

    def report() -> Operation:
        return operation_report(
            op.pk,
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            state_version=lease.state_version,
            report=Report(outcome="failed", error_kind="transient", message="stopped"),
            execution_id=None,
            snapshot=lease.operation,
        )

    with gate_at("cancel.after_lock", "stop") as gate:
        stopper, stopped = in_thread(lambda: STOPS[stop](owner.actor, task.pk, "x"), "stop")
        assert gate.reached.wait(30), "the stop never locked the operations"
        reporter, reported = in_thread(report, "reporter")
        wait_until_blocked_on_a_lock("the acceptance statement to wait for the stop's row lock")
        gate.release()
        stopper.join(30)
        reporter.join(30)

    stopped.result(timeout=1)
    reported.result(timeout=1)
    # The retry a transient failure would have scheduled is not: the task stopped first.
    _assert_stopped_and_quiet(op, task, stop)


def test_a_report_of_a_compensation_locks_its_original_before_the_task(settings):
    """Settling a compensation also moves its original: both operation rows are locked (in
    ascending id) before the task row, so a cancel of the task can not interleave."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    original = factories.operation(
        owner, task, tool="demo.inventory.reserve", params={"sku": "a", "qty": 1}
    )
    execution = execution_for_agent("worker").pk
    lease = operation_claim(original.pk, execution_id=execution)
    assert isinstance(lease, Lease)
    operation_report(
        original.pk,
        lease_generation=1,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="unknown"),
        execution_id=execution,
    )
    # Out of retries with the outcome unknown, support starts a compensation.
    Operation.objects.filter(pk=original.pk).update(
        status="unresolved", result={"id": "rsv_1"}, next_attempt_at=None
    )
    from runtime.resolutions import operation_resolve

    original.refresh_from_db()
    operation_resolve(
        support.actor,
        original.pk,
        resolution="compensate",
        evidence="undo",
        state_version=original.state_version,
    )
    compensation = Operation.objects.get(compensates=original)
    comp_lease = operation_claim(compensation.pk, execution_id=execution)
    assert isinstance(comp_lease, Lease)

    def report() -> Operation:
        return operation_report(
            compensation.pk,
            lease_generation=comp_lease.lease_generation,
            lease_token=comp_lease.lease_token,
            state_version=comp_lease.state_version,
            report=Report(outcome="succeeded", result={"released": True}),
            execution_id=execution,
        )

    with gate_at("operation.updated", "reporter") as gate:
        reporter, reported = in_thread(report, "reporter")
        assert gate.reached.wait(30)
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        wait_until_blocked_on_a_lock("the cancel to wait for the compensation's rows")
        gate.release()
        reporter.join(30)
        stopper.join(30)
    reported.result(timeout=1)
    stopped.result(timeout=1)
    original.refresh_from_db()
    assert original.status == "compensated"


# --- resume: its announcements reference the operations, so it locks them before the task -----


def test_a_resume_racing_a_stop_waits_for_the_stops_operation_rows_and_never_deadlocks():
    """The stop holds the paused task's operation rows (FOR UPDATE) and has not locked the task
    yet; a resume starts. An announcement's foreign key takes a share lock on its operation at
    commit, so a resume that locked the task first would wait for the stop while the stop waits
    for it: ``deadlock detected``. Resume locks the claimable operations first (ascending id),
    waits for the stop, then finds the task ended and is refused."""
    from runtime.control import task_pause, task_resume
    from runtime.errors import TaskRefused
    from runtime.models import OutboxMessage, TaskCommand
    from runtime.transitions.claim_refusals import Refusal

    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    task_pause(owner.actor, task.pk)
    # A delivery for the paused task spends the announcement: resume will have to write one.
    refused = operation_claim(op.pk, execution_id=execution_for_agent("worker").pk)
    assert isinstance(refused, Refusal) and refused.reason == "the task is paused"
    assert not OutboxMessage.objects.filter(operation=op).exists()

    with gate_at("cancel.after_lock", "stop") as gate:
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        assert gate.reached.wait(30), "the stop never locked the operations"
        resumer, resumed = in_thread(lambda: task_resume(owner.actor, task.pk), "resumer")
        wait_until_blocked_on_a_lock("the resume to wait for the stop's operation rows")
        gate.release()
        stopper.join(30)
        resumer.join(30)

    assert stopped.result(timeout=1).cancellation != "none"  # raises a deadlock, if any
    error = resumed.exception(timeout=1)
    # Nothing was running: the cancel ended the task, and the resume is refused for that.
    assert isinstance(error, TaskRefused) and error.code == "task_terminal", error
    op.refresh_from_db()
    assert op.status == "cancelled"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert TaskCommand.objects.get(task=task, kind="resume").disposition == "refused"


# --- a gated claim: the operation row before its approval, as the release gate takes them ------


def test_a_late_decision_racing_a_gated_claim_waits_for_it_and_never_deadlocks(settings):
    """The claim of approved work releases its approval; a second operator's decision on the same
    approval arrives meanwhile. The gate locks the operation, then the approval; a claim that
    took the approval before the operation would deadlock with it. The claim locks the
    operation first, so the decision waits, then finds the approval released and is refused."""
    from runtime.approvals import approval_decide
    from runtime.errors import ApprovalDecided

    settings.HOTPATH = True  # the statement declines gated work: this is the path it takes
    owner = factories.agent()
    first, second = factories.console_user("operator"), factories.console_user("operator")
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 25000}
    )
    approval = op.approvals.get()

    def decide(who):
        return approval_decide(
            who.actor, approval.pk, decision="approve", reason="", params_hash=op.params_hash
        )

    decide(first)
    execution = execution_for_agent("worker").pk
    with gate_at("claim.approval_released", "claimer") as gate:
        claimer, claimed = in_thread(
            lambda: operation_claim(op.pk, execution_id=execution), "claimer"
        )
        assert gate.reached.wait(30), "the claim never released the approval"
        decider, decided = in_thread(lambda: decide(second), "decider")
        wait_until_blocked_on_a_lock("the late decision to wait for the claim's rows")
        gate.release()
        claimer.join(30)
        decider.join(30)

    assert isinstance(claimed.result(timeout=1), Lease)  # raises a deadlock, if any
    assert isinstance(decided.exception(timeout=1), ApprovalDecided)
    approval.refresh_from_db()
    assert approval.status == "released" and approval.decided_by == first.actor.label


def test_a_late_signal_never_waits_for_a_stop_holding_its_expired_wait():
    """A stop holds the task's operation rows (an expired signal wait among them) and is about to
    lock the task row. A signal for that wait arrives: it is late. Linking it to the wait would
    share-lock the wait at commit while holding the task row, which the stop waits for: a
    deadlock. The signal takes the wait only with SKIP LOCKED before the task row, so it
    commits (late, unlinked) without waiting, and the stop then goes on."""
    from runtime.signals import signal_send
    from runtime.waits import wait_sweep

    owner = factories.agent()
    task = factories.task(owner)
    wait = factories.operation(
        owner, task, kind="wait_signal", tool="", signal="go", timeout_seconds=60
    )
    Operation.objects.filter(pk=wait.pk).update(wait_until=wait.created_at)
    assert wait_sweep()["waits_expired"] == 1

    with gate_at("cancel.after_lock", "stop") as gate:
        stopper, stopped = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "stop")
        assert gate.reached.wait(30), "the stop never locked the operations"
        _, signalled = in_thread(
            lambda: signal_send(owner.actor, task.pk, event_id="e1", name="go", payload={}),
            "signaller",
        )
        # Bounded only so that a regression fails instead of hanging; nothing is ordered by it.
        answer = signalled.result(timeout=30)
        gate.release()
        stopper.join(30)

    assert answer.disposition == "late"
    assert stopped.result(timeout=1).cancellation != "none"  # raises a deadlock, if any


def test_bulk_decisions_over_rest_racing_a_cancel_do_not_deadlock():
    """Items listed in descending operation order: were the whole bulk one transaction, its
    locks would pile up across items (higher operation, then task, then the lower operation)
    against the cancel's order (operations ascending, then task). Each item commits alone."""
    from runtime.models import Approval

    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    ops = sorted(
        (
            factories.operation(
                owner,
                task,
                step=f"pay-{i}",
                tool="demo.payments.charge",
                params={"account": f"a{i}", "amount_cents": 20000 + i},
            )
            for i in range(2)
        ),
        key=lambda o: o.pk,
    )
    approvals = [Approval.objects.get(operation=op) for op in reversed(ops)]
    body = {
        "decisions": [
            {"approval": a.pk, "decision": "approve", "reason": "", "params_hash": a.params_hash}
            for a in approvals
        ]
    }
    with gate_at("approval.before_commit", "bulk") as gate:
        _, bulk = in_thread(
            lambda: operator.client().post("/api/v1/approvals/decisions", body, format="json"),
            name="bulk",
        )
        assert gate.reached.wait(timeout=30)
        _, cancel = in_thread(lambda: task_cancel(owner.actor, task.pk, "stop"))
        wait_until_blocked_on_a_lock("the cancel to wait for the bulk's first item")
        gate.release()
        response = bulk.result(timeout=60)
        cancel.result(timeout=60)  # raises if the cancel died (deadlock detected)
    assert response.status_code == 200, response.content
    assert Task.objects.get(pk=task.pk).cancellation != "none"
