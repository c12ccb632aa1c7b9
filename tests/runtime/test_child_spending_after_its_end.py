"""A child's spending does not end when the child does: its saga's compensations, a person's
resolution of what it left unresolved (which may start a compensation) and its own children all
spend from its ledger afterwards. Its allocation is settled in its parent's ledger only once
that is over, so the parent books everything the child spent and admits only what is left
(issue 34, N1: the parent booked 1 of the child's 2 tool calls and admitted 2 more under a
limit of 3)."""

from __future__ import annotations

import pytest

from runtime.cancellation import children_sweep, task_fail
from runtime.errors import BudgetExhausted
from runtime.executions import execution_for_agent
from runtime.executor import operation_execute
from runtime.models import BudgetHold, BudgetMeter, Operation, Task, UsageRecord
from runtime.reactor import parent_rest
from runtime.resolutions import operation_resolve
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock

pytestmark = pytest.mark.django_db


def ledger(task: Task, name: str = "tool_calls") -> tuple[int, int, int, int]:
    m = BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter=name)
    return m.limit, m.reserved, m.posted, m.unknown


def admitted(owner: factories.Principal, task: Task, tries: int = 3) -> int:
    """How many more tool calls the task admits (each holds one tool call)."""
    count = 0
    for _ in range(tries):
        try:
            factories.operation(owner, task, executor="agent")
        except BudgetExhausted:
            break
        count += 1
    return count


def _parent_and_child(owner: factories.Principal) -> tuple[Task, Task]:
    parent = factories.task(owner, "parent", budget={"tool_calls": 3})
    child = factories.task(
        owner, "child", parent=parent.pk, budget={"tool_calls": 2}, compensate_on=["failed"]
    )
    assert ledger(parent) == (3, 2, 0, 0)
    return parent, child


def test_a_childs_compensation_is_booked_in_its_parent_which_then_admits_only_what_is_left():
    """The review's reproduction: the child's charge costs a tool call, the child fails, and its
    saga's refund costs another after the child ended."""
    owner = factories.agent()
    parent, child = _parent_and_child(owner)
    charge = factories.operation(
        owner, child, tool="demo.payments.charge", params={"account": "a", "amount_cents": 5}
    )
    factories.run_claimable(child.pk)
    assert Operation.objects.get(pk=charge.pk).status == "succeeded"

    task_fail(owner.actor, child.pk, "gave up")
    refund = Operation.objects.get(compensates=charge)
    assert refund.status == "pending"
    # The refund will spend from the child's ledger: the parent still holds the allocation.
    assert ledger(parent) == (3, 2, 0, 0)
    assert BudgetHold.objects.get(child_task=child).status == BudgetHold.HELD

    factories.run_claimable(child.pk)  # the refund runs in the ended child
    assert Operation.objects.get(pk=charge.pk).status == "compensated"
    assert ledger(child)[2] == 2
    assert ledger(parent) == (3, 0, 2, 0)  # both calls booked, the hold released
    assert admitted(owner, parent) == 1


def test_a_compensation_a_persons_resolution_starts_in_an_ended_child_is_booked_in_its_parent():
    """The child is failed while its reservation's outcome is unconfirmed: the reservation goes
    to a person, unresolved. A lookup finds it at the receiver, so it succeeded, and the saga
    (the child asked to be compensated when failed) releases it: two tool calls, both spent
    after the child ended, both booked in the parent once the release settled."""
    owner = factories.agent()
    parent, child = _parent_and_child(owner)
    reserve = factories.operation(
        owner,
        child,
        tool="demo.inventory.reserve",
        params={"sku": "sku-1", "qty": 1, "_fault": "unknown"},
    )
    operation_execute(reserve.pk)  # the receiver reserved; the answer was lost
    assert Operation.objects.get(pk=reserve.pk).status == "retry_scheduled"

    task_fail(owner.actor, child.pk, "gave up")
    reserve.refresh_from_db()
    assert reserve.status == "unresolved"
    # Its outcome is with a person, who may yet set spending in motion: nothing settled yet.
    assert ledger(parent) == (3, 2, 0, 0)

    support = factories.console_user("support")
    operation_resolve(
        support.actor,
        reserve.pk,
        resolution="lookup",
        evidence="",
        state_version=reserve.state_version,
    )
    release = Operation.objects.get(compensates=reserve)
    assert ledger(parent) == (3, 2, 0, 0)
    factories.run_claimable(child.pk)
    assert Operation.objects.get(pk=release.pk).status == "succeeded"
    assert Operation.objects.get(pk=reserve.pk).status == "compensated"
    assert ledger(child)[2:] == (2, 0)
    assert ledger(parent) == (3, 0, 2, 0)
    assert admitted(owner, parent) == 1


def _agent_call(owner: factories.Principal, task: Task) -> tuple[Operation, str, int]:
    op = factories.operation(owner, task, executor="agent")
    lease = agent_claim(op.pk, execution_for_agent("agent").pk, actor=owner.actor.label)
    return op, lease.lease_token, lease.lease_generation


def test_a_grandchilds_spending_after_its_parent_ended_is_booked_in_the_grandparent(
    django_capture_on_commit_callbacks,
):
    """The child fails while its own child is running a call: the grandchild is cancelled with
    it, its call's result is still accepted and spent, and that spending reaches the top."""
    owner = factories.agent()
    parent = factories.task(owner, "parent", budget={"tool_calls": 3})
    child = factories.task(owner, "child", parent=parent.pk, budget={"tool_calls": 2})
    grandchild = factories.task(owner, "grandchild", parent=child.pk, budget={"tool_calls": 1})
    op, token, generation = _agent_call(owner, grandchild)

    with django_capture_on_commit_callbacks(execute=True):
        task_fail(owner.actor, child.pk, "gave up")
    grandchild.refresh_from_db()
    assert grandchild.cancellation == "acknowledged"  # stopped with its parent, still running
    assert ledger(parent) == (3, 2, 0, 0)

    with django_capture_on_commit_callbacks(execute=True):
        agent_report(
            op,
            actor=owner.actor.label,
            lease_generation=generation,
            lease_token=token,
            report=Report(outcome="succeeded", result={}),
        )
    grandchild.refresh_from_db()
    assert (grandchild.condition, grandchild.outcome) == ("terminal", "cancelled")
    assert ledger(child)[1:3] == (0, 1)
    assert ledger(parent) == (3, 0, 1, 0)
    assert admitted(owner, parent) == 2


def test_the_sweeper_settles_a_child_only_once_its_spending_is_over():
    """What an after-commit step lost (the grandchild's look at its parent) the sweeper does,
    by the same rule: not while the child's own child still spends, once and whole after."""
    owner = factories.agent()
    parent = factories.task(owner, "parent", budget={"tool_calls": 3})
    child = factories.task(owner, "child", parent=parent.pk, budget={"tool_calls": 2})
    grandchild = factories.task(owner, "grandchild", parent=child.pk, budget={"tool_calls": 1})
    op, token, generation = _agent_call(owner, grandchild)
    task_fail(owner.actor, child.pk, "gave up")  # its after-commit steps never run here
    assert Task.objects.get(pk=child.pk).condition == "terminal"

    children_sweep()  # cancels the grandchild (the cascade left undone); the child is not due
    assert ledger(parent) == (3, 2, 0, 0)
    agent_report(
        op,
        actor=owner.actor.label,
        lease_generation=generation,
        lease_token=token,
        report=Report(outcome="succeeded", result={}),
    )
    assert ledger(parent) == (3, 2, 0, 0)  # the grandchild's look at the child was lost
    children_sweep()
    assert ledger(parent) == (3, 0, 1, 0)
    children_sweep()
    assert UsageRecord.objects.filter(child_task=child).count() == 1
    assert ledger(parent) == (3, 0, 1, 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_compensation_accepted_while_the_sweeper_and_a_rest_look_at_its_child_is_booked_once():
    """The refund's acceptance is written, not committed (it holds the refund, its original and
    the child's row); the sweeper and a rest of the child run meanwhile. Neither settles the
    child before the refund's cost is in its ledger, and the parent books it once."""
    owner = factories.agent()
    parent, child = _parent_and_child(owner)
    charge = factories.operation(
        owner, child, tool="demo.payments.charge", params={"account": "b", "amount_cents": 5}
    )
    factories.run_claimable(child.pk)
    task_fail(owner.actor, child.pk, "gave up")
    refund = Operation.objects.get(compensates=charge)

    def look() -> None:
        children_sweep()
        parent_rest(child.pk)

    with gate_at("report.before_commit", "worker") as gate:
        worker, ran = in_thread(lambda: operation_execute(refund.pk), "worker")
        assert gate.reached.wait(30), "the refund's acceptance never reached its commit"
        looker, looked = in_thread(look, "looker")
        wait_until_blocked_on_a_lock("the child's rest to wait for the refund's rows")
        assert not looked.done()
        gate.release()
        worker.join(30)
        looker.join(30)
    ran.result(timeout=1)
    looked.result(timeout=1)

    assert Operation.objects.get(pk=charge.pk).status == "compensated"
    assert ledger(parent) == (3, 0, 2, 0)
    assert UsageRecord.objects.filter(child_task=child).count() == 1
    assert admitted(owner, parent) == 1


def test_a_childs_cleanup_past_its_allocation_is_booked_in_its_parent_as_it_is_posted():
    """The simulation's seed 695791: a child spent its whole allocation (a charge and a
    reservation), failed, and its saga's compensations ran past it (undoing is never refused
    for money). The parent counts the overrun as soon as the first compensation posts it, while
    the second still runs, not only once the child settles: it admits nothing on money the
    child already spent."""
    owner = factories.agent()
    parent = factories.task(owner, "parent", budget={"tool_calls": 3})
    child = factories.task(
        owner, "child", parent=parent.pk, budget={"tool_calls": 2}, compensate_on=["failed"]
    )
    charge = factories.operation(
        owner, child, tool="demo.payments.charge", params={"account": "c", "amount_cents": 5}
    )
    reserve = factories.operation(
        owner, child, tool="demo.inventory.reserve", params={"sku": "sku-2", "qty": 1}
    )
    factories.run_claimable(child.pk)
    assert {Operation.objects.get(pk=o.pk).status for o in (charge, reserve)} == {"succeeded"}
    assert ledger(child)[:3] == (2, 0, 2)

    task_fail(owner.actor, child.pk, "gave up")
    first = Operation.objects.get(compensates__isnull=False, task=child)
    operation_execute(first.pk)
    assert Operation.objects.get(pk=first.pk).status == "succeeded"
    second = Operation.objects.exclude(pk=first.pk).get(compensates__isnull=False, task=child)
    assert second.status == "pending"  # the child's spending is not over
    assert ledger(child)[2] == 3  # one past its allocation
    assert BudgetHold.objects.get(child_task=child).amount == 3
    assert ledger(parent) == (3, 3, 0, 0)
    assert admitted(owner, parent) == 0

    factories.run_claimable(child.pk)
    assert ledger(child)[2] == 4
    assert ledger(parent) == (3, 0, 4, 0)  # settled: all four posted, the hold released
