"""Every edge of the operation, task, cancellation and approval tables (runtime.rules.statuses) is
driven, read from the journal's (from, to) pairs (runtime.simulation.edges): by the seeded
simulation's runs, and by the scenarios below for what those runs rarely reach. An edge nothing
drives fails the test, unless it is listed in NO_WRITER with the reason no writer can drive it;
a listed edge that something drives fails it too (the list must stay true)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from runtime.accounts import console_user_create
from runtime.approval_expiry import approval_expire_sweep
from runtime.approvals import approval_decide
from runtime.cancellation import task_cancel, task_fail
from runtime.executions import execution_for_agent
from runtime.models import Approval, Event, Operation, Task
from runtime.resolutions import operation_resolve
from runtime.rules.statuses import MACHINES
from runtime.simulation.edges import EdgeLog
from runtime.simulation.engine import run, schedule_for
from runtime.specs import OperationSpec
from runtime.tools import adapter_for
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease, lease_expire_sweep
from runtime.transitions.propose_wait import wait_propose
from runtime.waits import wait_renew, wait_sweep, wait_transform
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True)]

# (machine, source, target) -> why no writer can drive it. The rule is that such an
# edge leaves the table (runtime/rules/statuses.py); until it does, it is named here.
NO_WRITER = {
    ("operation", "running", "manual_intervention"): (
        "version_refused from running: a worker refuses a version at its claim (from pending "
        "or retry_scheduled, runtime.transitions.claim); nothing moves running work to "
        "manual_intervention"
    ),
    ("task", "waiting", "running"): (
        "a live task waits only on blocked work (approval, wait, unresolved, manual, expired), "
        "and no single change moves blocked work into active work in a live task: a claim "
        "starts from claimable work (runnable first), and a person's compensate of an "
        "unresolved operation needs its result, which only an ended task's saga leaves"
    ),
}

SEEDS = (2, 5)
STEPS = 300


def _claim(op: Operation, *, now=None) -> Lease:
    lease = operation_claim(op.pk, execution_id=execution_for_agent("edge-worker").pk, now=now)
    assert isinstance(lease, Lease), lease
    return lease


def _report(lease: Lease, report: Report) -> Operation:
    return operation_report(
        lease.operation_id,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=report,
        execution_id=execution_for_agent("edge-worker").pk,
    )


def _under_newer_code(op: Operation) -> None:
    """A worker whose tool no longer supports the version the work was recorded under claims
    it (once any retry of it is due)."""
    due = timezone.now() + timedelta(minutes=10)
    with mock.patch.object(adapter_for(op.tool), "supported_versions", ("0",)):
        refused = operation_claim(op.pk, execution_id=execution_for_agent("edge-new").pk, now=due)
    assert not isinstance(refused, Lease)
    op.refresh_from_db()
    assert op.status == "manual_intervention", op.status


def _fresh(op: Operation) -> Operation:
    return Operation.objects.get(pk=op.pk)


def scenario_approver_loses_the_right() -> None:
    """An approved charge whose approver lost the right before its release goes back to a
    person: the operation to waiting_approval, the approval to pending."""
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 20000}
    )
    approval = Approval.objects.get(operation=op)
    approval_decide(
        operator.actor,
        approval.pk,
        decision="approve",
        reason="ok",
        params_hash=approval.params_hash,
    )
    console_user_create(operator.actor.label.partition(":")[2], "support", factories.PASSWORD)
    refused = operation_claim(op.pk, execution_id=execution_for_agent("edge-worker").pk)
    assert not isinstance(refused, Lease)
    assert _fresh(op).status == "waiting_approval"


def scenario_approvals_released_and_run_out() -> None:
    """An approved charge released by its claim; another approved but claimed after its
    validity ended (the release gate expires it)."""
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    ops = [
        factories.operation(
            owner,
            task,
            tool="demo.payments.charge",
            params={"account": "a", "amount_cents": 20000 + n},
            approval_timeout_seconds=30,
        )
        for n in range(2)
    ]
    for op in ops:
        approval = Approval.objects.get(operation=op)
        approval_decide(
            operator.actor,
            approval.pk,
            decision="approve",
            reason="ok",
            params_hash=approval.params_hash,
        )
    _claim(ops[0])
    # The second's validity ends (the gate reads it on the database's clock; an expiry moved
    # earlier only ends an approval sooner, which its seal allows).
    Approval.objects.filter(operation=ops[1]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    late = operation_claim(ops[1].pk, execution_id=execution_for_agent("edge-worker").pk)
    assert not isinstance(late, Lease)
    assert [Approval.objects.get(operation=op).status for op in ops] == ["released", "expired"]


def scenario_retries_stopped() -> None:
    """A retry the ledger cannot hold again fails; another retry is cancelled with its task, and
    so are a wait and a request for approval of that task."""
    owner = factories.agent()
    task = factories.task(owner, budget={"tool_calls": 1})
    op = factories.operation(owner, task, tool="demo.echo", params={"n": 1})
    _report(_claim(op), Report(outcome="failed", error_kind="transient", message="busy"))
    due = timezone.now() + timedelta(minutes=10)
    operation_claim(op.pk, execution_id=execution_for_agent("edge-worker").pk, now=due)
    other_task = factories.task(owner)
    other = factories.operation(owner, other_task, tool="demo.echo", params={"n": 2})
    _report(_claim(other), Report(outcome="failed", error_kind="transient", message="busy"))
    waiting, _ = wait_propose(
        owner.actor,
        other_task.pk,
        OperationSpec(kind=Operation.KIND_WAIT_SIGNAL, step="w", signal="go", timeout_seconds=60),
    )
    gated = factories.operation(
        owner,
        other_task,
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 20000},
    )
    task_cancel(owner.actor, other_task.pk, "enough")
    stopped = [_fresh(o).status for o in (other, waiting, gated)]
    assert (_fresh(op).status, stopped) == ("failed", ["cancelled"] * 3)


def scenario_expired_approval_transformed() -> None:
    owner, admin = factories.agent(), factories.console_user("admin")
    task = factories.task(owner)
    op = factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 20000},
        approval_timeout_seconds=30,
    )
    later = timezone.now() + timedelta(seconds=60)
    with mock.patch("django.utils.timezone.now", lambda: later):
        approval_expire_sweep(now=later)
    assert _fresh(op).status == "expired"
    wait_transform(admin.actor, op.pk, reason="not wanted")
    assert Approval.objects.get(operation=op).status == "denied"


def scenario_expired_wait_renewed() -> None:
    owner, admin = factories.agent(), factories.console_user("admin")
    task = factories.task(owner)
    op, _ = wait_propose(
        owner.actor,
        task.pk,
        OperationSpec(kind=Operation.KIND_WAIT_SIGNAL, step="w", signal="go", timeout_seconds=30),
    )
    later = timezone.now() + timedelta(seconds=60)
    with mock.patch("django.utils.timezone.now", lambda: later):
        wait_sweep(now=later)
    assert _fresh(op).status == "expired"
    wait_renew(admin.actor, op.pk, expires_in_seconds=60, reason="still wanted")
    assert _fresh(op).status == "waiting"


def scenario_work_stopped_for_a_person() -> None:
    """Work a worker refused by its version: requeued by support, refused again from
    retry_scheduled, and stopped with an unconfirmed call (unresolved); other such work
    abandoned, and cancelled with its task."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    reserve = factories.operation(
        owner, task, tool="demo.inventory.reserve", params={"sku": "s", "qty": 1}
    )
    _under_newer_code(reserve)
    reserve = _fresh(reserve)
    operation_resolve(
        support.actor,
        reserve.pk,
        resolution="requeue",
        evidence="deployed",
        state_version=reserve.state_version,
    )
    lease = _claim(_fresh(reserve))
    assert _report(lease, Report(outcome="unknown", message="lost")).status == "retry_scheduled"
    _under_newer_code(reserve)  # from retry_scheduled
    abandoned = factories.operation(owner, task, tool="demo.echo", params={"n": 1})
    _under_newer_code(abandoned)
    abandoned = _fresh(abandoned)
    operation_resolve(
        support.actor,
        abandoned.pk,
        resolution="abandon",
        evidence="not needed",
        state_version=abandoned.state_version,
    )
    cancelled = factories.operation(owner, task, tool="demo.echo", params={"n": 2})
    _under_newer_code(cancelled)
    task_cancel(owner.actor, task.pk, "enough")
    assert (_fresh(reserve).status, _fresh(cancelled).status) == ("unresolved", "cancelled")


def scenario_a_saga_with_a_person() -> None:
    """A charge undone by a saga whose refund runs out of attempts (unresolved); support says
    the refund did nothing, so the charge is back with a person, who has it compensated."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner, compensate_on=["failed"])
    charge = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 500}
    )
    lease = _claim(charge)
    _report(lease, Report(outcome="succeeded", result={"id": "ch_edge"}))
    task_fail(owner.actor, task.pk, "gave up")
    refund = Operation.objects.get(compensates_id=charge.pk)
    later = timezone.now()
    while _fresh(refund).status == "pending":  # every claim's lease runs out: exhausted
        later += timedelta(minutes=5)
        if not isinstance(
            operation_claim(
                refund.pk, execution_id=execution_for_agent("edge-worker").pk, now=later
            ),
            Lease,
        ):
            break
        lease_expire_sweep(now=later + timedelta(minutes=1))
    refund = _fresh(refund)
    assert refund.status == "unresolved", refund.status
    operation_resolve(
        support.actor,
        refund.pk,
        resolution="no_effect",
        evidence="no refund at the provider",
        state_version=refund.state_version,
    )
    charge = _fresh(charge)
    assert charge.status == "unresolved", charge.status
    operation_resolve(
        support.actor,
        charge.pk,
        resolution="compensate",
        evidence="refund it",
        state_version=charge.state_version,
    )
    assert _fresh(charge).status == "compensating"


def scenario_past_the_deadline() -> None:
    """Work not started by its task's deadline expires at its claim, pending or retried."""
    owner = factories.agent()
    task = factories.task(owner, deadline_seconds=600)
    first = factories.operation(owner, task, tool="demo.echo", params={"n": 1})
    retried = factories.operation(owner, task, tool="demo.echo", params={"n": 2})
    lease = _claim(retried)
    _report(lease, Report(outcome="failed", error_kind="transient", message="busy"))
    late = timezone.now() + timedelta(seconds=700)
    for op in (first, retried):
        operation_claim(op.pk, execution_id=execution_for_agent("edge-worker").pk, now=late)
        assert _fresh(op).status == "expired"


def scenario_failed_with_a_call_in_flight() -> None:
    """A task failed by its owner while a call runs ends when the call's report settles it:
    the task goes from running straight to terminal (the seeds reach it only on some
    schedules)."""
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.echo", params={"n": 1})
    lease = _claim(op)
    task_fail(owner.actor, task.pk, "enough")
    _report(lease, Report(outcome="succeeded", result={"ok": True}))
    assert Task.objects.get(pk=task.pk).condition == "terminal"


def scenario_pure_call_lost_after_the_stop() -> None:
    """A pure call's worker goes silent after its task was cancelled: the takeover finds the
    task stopping and the call pure (nothing to fear from it), so it is simply cancelled, from
    running (the seeds reach it only on some schedules)."""
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.echo", params={"n": 3})
    _claim(op)
    task_cancel(owner.actor, task.pk, "withdrawn")
    assert _fresh(op).status == "running"
    lease_expire_sweep(now=timezone.now() + timedelta(hours=1))
    assert _fresh(op).status == "cancelled"


def scenario_unresolved_sent_again() -> None:
    """A charge whose one attempt's outcome was lost waits for a person, who has it sent again
    under the same key (the receiver dedupes): back to pending (the seeds reach it only on
    some schedules)."""
    owner, support = factories.agent(), factories.console_user("support")
    task = factories.task(owner)
    op = factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 300},
        max_attempts=1,
    )
    _report(_claim(op), Report(outcome="unknown", message="lost"))
    op = _fresh(op)
    assert op.status == "unresolved", op.status
    again = operation_resolve(
        support.actor,
        op.pk,
        resolution="retry_same_key",
        evidence="the receiver dedupes by key",
        state_version=op.state_version,
    )
    assert again.status == "pending", again.status


SCENARIOS: tuple[Callable[[], None], ...] = (
    scenario_approver_loses_the_right,
    scenario_approvals_released_and_run_out,
    scenario_retries_stopped,
    scenario_expired_approval_transformed,
    scenario_expired_wait_renewed,
    scenario_work_stopped_for_a_person,
    scenario_a_saga_with_a_person,
    scenario_past_the_deadline,
    scenario_failed_with_a_call_in_flight,
    scenario_pure_call_lost_after_the_stop,
    scenario_unresolved_sent_again,
)


def _journal_edges() -> EdgeLog:
    log = EdgeLog()
    rows = Event.objects.order_by("task_id", "seq").values_list(
        "task_id", "type", "operation_id", "data"
    )
    for task_id, type, op_id, data in rows:
        log.feed(task_id, type, op_id, data)
    return log


def test_every_edge_of_the_tables_is_driven():
    simulated = EdgeLog()
    for seed in SEEDS:
        outcome = run(seed, schedule_for(seed, STEPS), record=False)
        assert outcome.violation is None, f"{outcome.violation} (make simulate SEED={seed})"
        simulated.merge(outcome.edges)
    for scenario in SCENARIOS:  # after the last run: their journals are read together
        scenario()
    driven = _journal_edges()
    driven.merge(simulated.edges)
    every = {
        (name, e.source, e.target) for name, machine in MACHINES.items() for e in machine.edges
    }
    reached = {(name, s, t) for name, pairs in driven.edges.items() for s, t in pairs}
    missing = sorted(every - reached - set(NO_WRITER))
    assert not missing, f"edges nothing drove: {missing}"
    listed_but_driven = sorted(set(NO_WRITER) & reached)
    assert not listed_but_driven, f"driven, so not without a writer: {listed_but_driven}"
    # The journal shows no move the tables lack.
    assert reached <= every, sorted(reached - every)
    # The simulation drives most of them itself.
    assert len({(n, s, t) for n, p in simulated.edges.items() for s, t in p}) >= len(every) // 2
