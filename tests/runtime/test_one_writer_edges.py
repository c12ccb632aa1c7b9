"""Issue 21, the edges one writer per transition closes: the release recheck of an approval
(R4), a task's first ending standing (R5), a child's whole usage in its parent's ledger (R6), a
proposal bound to the attempt read under the task's lock (R9), a parent coming to rest once when
two children end together (R10), and leases kept on the database's clock. The races run real
concurrent transactions stopped at named crash points; the rest runs on SQLite too."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db.models import F
from django.utils import timezone

from runtime.approvals import approval_decide
from runtime.attempts import attempt_create
from runtime.cancellation import task_cancel, task_fail
from runtime.completion import task_complete
from runtime.db import db_now
from runtime.errors import BudgetExhausted, TaskRefused
from runtime.executions import execution_for_agent
from runtime.models import Approval, Attempt, BudgetHold, BudgetMeter, Event, Operation, Task
from runtime.reactor import parent_rest
from runtime.sandbox import receivers
from runtime.selectors.waits import expired_waits
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim, operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep, lease_heartbeat
from tests import factories
from tests.concurrency import gate_at, in_thread, lock_waiters, wait_until_blocked_on_a_lock
from tests.conftest import wait_for

BIG = {"account": "acct-1", "amount_cents": 25000}


def _approved(owner, operator):
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.payments.charge", params=dict(BIG))
    approval = Approval.objects.get(operation=op)
    approval_decide(
        operator.actor,
        approval.pk,
        decision="approve",
        reason="looks right",
        params_hash=approval.params_hash,
    )
    op.refresh_from_db()
    assert op.status == "pending"
    return task, op, approval


def _claim(op):
    return operation_claim(op.pk, execution_id=execution_for_agent("worker").pk)


def _nothing_ran(op) -> None:
    assert receivers.effects_under("payments", op.idempotency_key) == []
    assert not op.invocations.exists()


# --- R4: the release recheck --------------------------------------------------------------


@pytest.mark.django_db
def test_an_approval_that_expired_while_its_work_waited_is_not_released_but_goes_to_a_person():
    """Approved, then its work waited (for a concurrency slot) past the approval's validity: at
    release the approval goes ``approved -> expired``, the operation ``expired``, nothing runs,
    and the wait is an admin's on /waits/ (renew it and an operator decides again)."""
    owner, operator, admin = (
        factories.agent(),
        factories.console_user("operator"),
        factories.console_user("admin"),
    )
    _, op, approval = _approved(owner, operator)
    # The validity ran out while the work waited (on the database's clock).
    Approval.objects.filter(pk=approval.pk).update(expires_at=db_now() - timedelta(seconds=1))

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    approval.refresh_from_db()
    op.refresh_from_db()
    assert (approval.status, op.status) == ("expired", "expired")
    _nothing_ran(op)
    assert Event.objects.filter(operation=op, type="approval.expired").exists()
    assert op in expired_waits(admin.actor)
    page = admin.client().get(f"/api/v1/approvals/{approval.pk}").json()
    assert page["status"] == "expired"
    # A second delivery finds nothing to claim.
    assert isinstance(_claim(op), Refusal)


@pytest.mark.django_db
def test_an_approver_deactivated_before_release_voids_the_decision_and_it_waits_again():
    owner, operator, other = (
        factories.agent(),
        factories.console_user("operator"),
        factories.console_user("operator"),
    )
    _, op, approval = _approved(owner, operator)
    user = operator.actor_user()
    user.is_active = False
    user.save(update_fields=["is_active"])

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    approval.refresh_from_db()
    op.refresh_from_db()
    assert (approval.status, op.status) == ("pending", "waiting_approval")
    assert approval.decided_by == "" and "approver" in approval.reason
    _nothing_ran(op)
    listed = other.client().get("/api/v1/approvals?status=pending").json()
    assert approval.pk in {row["id"] for row in listed["results"]}
    # Another operator approves; the next claim releases and runs it.
    approval_decide(
        other.actor, approval.pk, decision="approve", reason="ok", params_hash=op.params_hash
    )
    assert isinstance(_claim(op), Lease)
    approval.refresh_from_db()
    assert approval.status == "released"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_approver_losing_the_role_while_the_claim_runs_stops_the_release():
    """The claim has read the approved operation; an admin takes the operator role away and that
    commits; the release, rechecking the approver's right in the claim's transaction, refuses:
    nothing runs and the approval waits for another approver."""
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _approved(owner, operator)

    with gate_at("claim.after_read", "claimer") as gate:
        claimer, claimed = in_thread(lambda: _claim(op), "claimer")
        assert gate.reached.wait(30), "the claim never read the operation"
        operator.actor_user().groups.remove(Group.objects.get(name="operator"))
        gate.release()
        claimer.join(30)

    assert isinstance(claimed.result(timeout=1), Refusal)
    approval.refresh_from_db()
    op.refresh_from_db()
    assert (approval.status, op.status) == ("pending", "waiting_approval")
    _nothing_ran(op)
    assert Event.objects.filter(operation=op, type="approval.reopened").exists()


# --- R5: a task's first accepted ending stands ---------------------------------------------


def _running(owner, task):
    op = factories.operation(owner, task, executor="agent", params={"v": 1})
    lease = agent_claim(op.pk, execution_for_agent("agent").pk, actor=owner.actor.label)
    return op, lease


def _settle(owner, op, lease) -> None:
    agent_report(
        op,
        actor=owner.actor.label,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        report=Report(outcome="failed", error_kind="transient", message="stopped"),
    )


@pytest.mark.django_db
def test_a_fail_after_an_accepted_cancel_is_refused_and_the_cancel_ends_the_task():
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _running(owner, task)
    task_cancel(owner.actor, task.pk, "stop")
    with pytest.raises(TaskRefused) as refused:
        task_fail(owner.actor, task.pk, "give up")
    assert refused.value.code == "task_cancelled"
    _settle(owner, op, lease)
    task.refresh_from_db()
    assert (task.condition, task.outcome) == ("terminal", "cancelled")
    assert not Event.objects.filter(task=task, type="task.failed").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_fail_racing_a_cancel_waits_for_it_and_the_outcome_never_flips():
    """The cancel holds the task's operations (first in the lock order); the fail waits for
    them, then reads the task under its lock, finds the cancel accepted and is refused (409).
    Before, it ended the task ``failed`` and the running work's settling flipped it to
    ``cancelled``."""
    owner = factories.agent()
    task = factories.task(owner)
    op, lease = _running(owner, task)

    with gate_at("cancel.after_lock", "cancel") as gate:
        canceller, cancelled = in_thread(lambda: task_cancel(owner.actor, task.pk, "x"), "cancel")
        assert gate.reached.wait(30), "the cancel never locked the operations"
        failer, failed = in_thread(lambda: task_fail(owner.actor, task.pk, "y"), "fail")
        wait_until_blocked_on_a_lock("the fail to wait for the cancel's operation rows")
        gate.release()
        canceller.join(30)
        failer.join(30)

    cancelled.result(timeout=1)
    with pytest.raises(TaskRefused) as refused:
        failed.result(timeout=1)
    assert refused.value.code == "task_cancelled"
    _settle(owner, op, lease)
    task.refresh_from_db()
    assert (task.condition, task.outcome) == ("terminal", "cancelled")
    attempt = Attempt.objects.get(pk=task.current_attempt_id)
    assert attempt.outcome == "cancelled"
    endings = Event.objects.filter(task=task, type__in=("task.failed", "task.cancelled"))
    assert list(endings.values_list("type", flat=True)) == ["task.cancelled"]


# --- R6: a child's whole usage lands in its parent's ledger --------------------------------


def _meter(task, name="cost_cents") -> BudgetMeter:
    return BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter=name)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_childs_overrun_lands_in_its_parent_as_it_completes_and_blocks_admission():
    """The child spent 1200 against an allocation of 100. Its completion settles the parent's
    ledger in its own transaction (stopped before commit); a proposal in the parent waits for
    the meter row and is refused: the overrun is posted whole (posted 1200 > limit 1000), not
    ``min(posted, allocation)``, and not left for the sweeper."""
    owner = factories.agent()
    parent = factories.task(owner, budget={"cost_cents": 1000})
    child = factories.task(owner, parent=parent.pk, budget={"cost_cents": 100})
    op = factories.operation(owner, child, executor="agent", estimate={"cost_cents": 50})
    lease = agent_claim(op.pk, execution_for_agent("agent").pk, actor=owner.actor.label)
    agent_report(
        op,
        actor=owner.actor.label,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        report=Report(outcome="succeeded", result={}, usage={"cost_cents": 1200}),
    )
    assert _meter(child).posted == 1200

    def propose() -> Operation:
        return factories.operation(owner, parent, executor="agent", estimate={"cost_cents": 10})

    with gate_at("complete.before_commit", "completer") as gate:
        completer, completed = in_thread(lambda: task_complete(owner.actor, child.pk), "completer")
        assert gate.reached.wait(30), "the completion never reached its commit"
        proposer, proposed = in_thread(propose, "proposer")
        wait_for(
            lambda: lock_waiters() >= 1 or proposed.done(),
            what="the proposal to wait for the parent's meter (or finish)",
        )
        gate.release()
        completer.join(30)
        proposer.join(30)

    assert completed.result(timeout=1).outcome == "succeeded"
    with pytest.raises(BudgetExhausted):
        proposed.result(timeout=1)
    meter = _meter(parent)
    assert (meter.limit, meter.reserved, meter.posted) == (1000, 0, 1200)
    assert not BudgetHold.objects.filter(child_task=child, status=BudgetHold.HELD).exists()
    body = owner.client().get(f"/api/v1/tasks/{parent.pk}/budget").json()
    shown = body["meters"]["cost_cents"]
    assert shown["posted"] > shown["limit"] and shown["available"] == 0


# --- R9: a proposal binds to the attempt read under the task's lock ------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["statement", "general", "rest"])
def test_a_proposal_racing_a_new_attempt_lands_in_the_new_attempt(path, settings):
    """A new attempt holds the task row (written, not committed); a proposal read the task before
    it and waits for that row. It must land in the new attempt, with that attempt's key and
    ledger: before, it landed in the ended attempt (whose ledger, shrunk to what it committed,
    refused the estimate with ``budget_exhausted``). Over REST with an Idempotency-Key the
    statement runs in the request's transaction without a savepoint: the one that found the
    attempt moved wrote nothing and failed nothing, so the same transaction proposes again."""
    settings.HOTPATH = True
    owner = factories.agent()
    budget = {"cost_cents": 1000} if path == "general" else {}
    task = factories.task(owner, budget=budget)
    first = task.current_attempt_id
    estimate = {"cost_cents": 100} if path == "general" else {}

    def propose() -> Operation:
        if path == "rest":
            response = owner.client().post(
                f"/api/v1/tasks/{task.pk}/operations",
                {"tool": "demo.echo", "step": "s", "executor": "agent", "params": {}},
                format="json",
                HTTP_IDEMPOTENCY_KEY="race",
            )
            assert response.status_code == 201, response.content
            return Operation.objects.get(pk=response.json()["id"])
        return factories.operation(owner, task, step="s", executor="agent", estimate=estimate)

    with gate_at("attempt.before_commit", "attempt") as gate:
        starter, started = in_thread(lambda: attempt_create(owner.actor, task.pk), "attempt")
        assert gate.reached.wait(30), "the attempt never reached its commit"
        proposer, proposed = in_thread(propose, "proposer")
        wait_until_blocked_on_a_lock("the proposal to wait for the task row")
        gate.release()
        starter.join(30)
        proposer.join(30)

    attempt = started.result(timeout=1)
    op = proposed.result(timeout=1)
    assert attempt.pk != first
    op.refresh_from_db()
    assert op.attempt_id == attempt.pk
    # The key is the new attempt's: the same step proposed again in it is the same operation.
    again = factories.operation(owner, task, step="s", executor="agent", estimate=estimate)
    assert again.pk == op.pk
    if path == "general":
        held = BudgetHold.objects.get(operation=op)
        assert held.meter.attempt_id == attempt.pk


# --- R10: two children ending at once bring their parent to rest once ----------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_parent_rests_at_once_end_the_parent_once_without_an_error():
    owner = factories.agent()
    parent = factories.task(owner)
    children = [factories.task(owner, parent=parent.pk) for _ in range(2)]
    for child in children:
        _running(owner, child)
    task_cancel(owner.actor, parent.pk, "stop")  # the children are cancelled after its commit
    wait_for(
        lambda: Task.objects.filter(parent=parent, cancellation="acknowledged").count() == 2,
        what="the cascade to reach both children",
    )
    # Both children's running work settled and both ended; their parents' rests now race.
    Operation.objects.filter(task__in=children).update(status="cancelled")
    Task.objects.filter(pk__in=[c.pk for c in children]).update(
        condition="terminal",
        cancellation="quiescent",
        outcome="cancelled",
        ops_active=0,
        state_version=F("state_version") + 1,
    )

    with gate_at("rest.after_read", "first") as gate:
        first, first_done = in_thread(lambda: parent_rest(parent.pk), "first")
        assert gate.reached.wait(30), "the first rest never read the parent"
        second, second_done = in_thread(lambda: parent_rest(parent.pk), "second")
        wait_for(
            lambda: lock_waiters() >= 1 or second_done.done(),
            what="the second rest to wait for the parent's row (or finish)",
        )
        gate.release()
        first.join(30)
        second.join(30)

    first_done.result(timeout=1)  # neither raises TransitionRejected
    second_done.result(timeout=1)
    parent.refresh_from_db()
    assert (parent.condition, parent.cancellation, parent.outcome) == (
        "terminal",
        "quiescent",
        "cancelled",
    )
    assert Event.objects.filter(task=parent, type="task.cancelled").count() == 1


# --- leases on the database's clock --------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fast", [True, False], ids=["statement", "general"])
def test_a_worker_whose_clock_is_behind_keeps_its_lease(fast, settings):
    """A worker an hour behind the database claims and heartbeats with its own clock; the
    sweeper (on the database's clock) must not take the live lease over. Before, the lease's
    expiry was the worker's clock plus the lease: already past for the sweeper."""
    settings.HOTPATH = fast  # the claim statement, and the general claim
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    skewed = timezone.now() - timedelta(hours=1)

    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk, now=skewed)
    assert isinstance(lease, Lease)
    assert lease.lease_expires_at > db_now()
    assert lease_expire_sweep() == 0

    expires, cancel = lease_heartbeat(op.pk, 1, lease.lease_token, now=skewed)
    assert expires > db_now() and not cancel
    assert lease_expire_sweep() == 0
    op.refresh_from_db()
    assert (op.status, op.lease_generation, op.lease_expires_at) == ("running", 1, expires)
