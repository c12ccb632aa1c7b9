"""Child tasks draw from their parent's ledger, inherit its deadline, stop with it, and hold
its quiescence; a new attempt is a new pursuit with new keys and its own allocation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.attempts import attempt_create
from runtime.cancellation import task_cancel
from runtime.errors import BudgetExhausted, InvalidInput, TaskRefused
from runtime.models import BudgetMeter, Operation, Task
from runtime.tasks import TaskSpec, task_create
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim
from tests import factories


def exe(label: str) -> str:
    from runtime.models import Execution

    return Execution.objects.create(kind="agent", host="test", label=label).pk


pytestmark = pytest.mark.django_db


def ledger(task, name="cost_cents") -> tuple[int, int, int, int]:
    m = BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter=name)
    return m.limit, m.reserved, m.posted, m.unknown


def test_a_childs_allocation_comes_out_of_its_parents_ledger():
    alice = factories.agent()
    parent = factories.task(alice, budget={"cost_cents": 100})
    child = factories.task(alice, parent=parent.pk, budget={"cost_cents": 50})
    assert ledger(parent) == (100, 50, 0, 0)
    assert ledger(child) == (50, 0, 0, 0)
    tasks_before = Task.objects.count()
    with pytest.raises(BudgetExhausted):
        factories.task(alice, parent=parent.pk, budget={"cost_cents": 41})
    assert Task.objects.count() == tasks_before
    assert ledger(parent) == (100, 50, 0, 0)


def test_a_child_of_a_budgeted_parent_must_declare_its_allocation():
    alice = factories.agent()
    parent = factories.task(alice, budget={"cost_cents": 100})
    with pytest.raises(InvalidInput):
        factories.task(alice, parent=parent.pk)


def test_a_child_inherits_the_parents_deadline_or_a_shorter_one():
    alice = factories.agent()
    parent = factories.task(alice, deadline_seconds=600)
    assert factories.task(alice, parent=parent.pk).deadline == parent.deadline
    later = factories.task(alice, parent=parent.pk, deadline_seconds=6000)
    assert later.deadline == parent.deadline
    sooner = factories.task(alice, parent=parent.pk, deadline_seconds=60)
    assert sooner.deadline < parent.deadline


def test_no_child_for_a_cancelled_parent(django_capture_on_commit_callbacks):
    alice = factories.agent()
    parent = factories.task(alice)
    with django_capture_on_commit_callbacks(execute=True):
        task_cancel(alice.actor, parent.pk)
    with pytest.raises(TaskRefused):
        task_create(alice.actor, TaskSpec(name="late child", parent=parent.pk))


def _complete(alice, op, usage):
    lease = agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    agent_report(
        op,
        actor=alice.actor.label,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        report=Report(outcome="succeeded", result={}, usage=usage),
    )


def test_cancelling_a_parent_stops_its_children_and_waits_for_them(
    django_capture_on_commit_callbacks,
):
    alice = factories.agent()
    parent = factories.task(alice, budget={"cost_cents": 100})
    child = factories.task(alice, parent=parent.pk, budget={"cost_cents": 60})
    running = factories.operation(alice, child, executor="agent", estimate={"cost_cents": 20})
    lease = agent_claim(running.pk, exe("exe_agent"), actor=alice.actor.label)
    waiting = factories.operation(alice, child, estimate={"cost_cents": 5})

    with django_capture_on_commit_callbacks(execute=True):
        task_cancel(alice.actor, parent.pk, "stop everything")
    parent.refresh_from_db()
    child.refresh_from_db()
    assert child.cancellation == "acknowledged"  # the child was stopped with its parent
    assert Operation.objects.get(pk=waiting.pk).status == "cancelled"
    # The parent has nothing of its own running, but its child does: it is not quiescent.
    assert parent.cancellation == "acknowledged"
    assert parent.condition != "terminal"

    with django_capture_on_commit_callbacks(execute=True):
        agent_report(
            running,
            actor=alice.actor.label,
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            report=Report(outcome="succeeded", result={}, usage={"cost_cents": 12}),
        )
    child.refresh_from_db()
    parent.refresh_from_db()
    assert (child.cancellation, child.outcome) == ("quiescent", "cancelled")
    assert (parent.cancellation, parent.outcome) == ("quiescent", "cancelled")
    # The child's hold in the parent's ledger became what the child spent.
    assert ledger(parent) == (100, 0, 12, 0)


def test_a_new_attempt_gets_new_keys_and_its_own_allocation():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    first = factories.operation(
        alice, task, step="fetch", executor="agent", estimate={"cost_cents": 30}
    )
    _complete(alice, first, {"cost_cents": 25})
    held = factories.operation(alice, task, step="other", estimate={"cost_cents": 10})

    attempt = attempt_create(alice.actor, task.pk, reason="new strategy")
    task.refresh_from_db()
    assert attempt.number == 2 and task.current_attempt_id == attempt.pk
    # 100 - 25 posted - 10 still held by the first attempt.
    assert ledger(task) == (65, 0, 0, 0)
    old = BudgetMeter.objects.get(attempt__number=1, task=task)
    assert (old.limit, old.reserved, old.posted) == (35, 10, 25)

    second = factories.operation(alice, task, step="fetch", executor="agent")
    assert second.pk != first.pk
    assert second.attempt_id == attempt.pk
    assert ":a2:" in second.idempotency_key and second.idempotency_key != first.idempotency_key
    # The earlier attempt's work stays, untouched.
    assert Operation.objects.get(pk=held.pk).status == "pending"


def test_only_the_tasks_agent_or_an_admin_starts_an_attempt():
    alice, bob = factories.agent(), factories.agent()
    operator = factories.console_user("operator")
    task = factories.task(alice)
    from runtime.errors import NotAuthorized, NotFound

    with pytest.raises(NotFound):
        attempt_create(bob.actor, task.pk)
    with pytest.raises(NotAuthorized):
        attempt_create(operator.actor, task.pk)
    assert attempt_create(factories.console_user("admin").actor, task.pk).number == 2


def test_no_attempt_for_a_task_past_its_deadline():
    alice = factories.agent()
    task = factories.task(alice, deadline_seconds=60)
    Task.objects.filter(pk=task.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    with pytest.raises(TaskRefused):
        attempt_create(alice.actor, task.pk)


# --- the end of an attempt ------------------------------------------------------------------


def _ended(attempt_id: str) -> tuple[str, bool]:
    from runtime.models import Attempt

    a = Attempt.objects.get(pk=attempt_id)
    return a.outcome, a.ended_at is not None


def test_a_task_that_ends_ends_its_attempt_with_its_outcome():
    from runtime.cancellation import task_fail
    from runtime.completion import task_complete
    from runtime.models import Event

    alice = factories.agent()
    done, gave_up = factories.task(alice), factories.task(alice)
    assert _ended(done.current_attempt_id) == ("", False)
    task_complete(alice.actor, done.pk)
    task_fail(alice.actor, gave_up.pk, reason="no way forward")
    assert _ended(done.current_attempt_id) == ("succeeded", True)
    assert _ended(gave_up.current_attempt_id) == ("failed", True)
    ended = Event.objects.get(task=done, type="attempt.ended")
    assert ended.actor == alice.actor.label
    assert ended.data["outcome"] == "succeeded" and ended.data["attempt"] == 1


def test_a_new_attempt_ends_the_one_it_replaces_keeping_its_unresolved_work_visible():
    alice = factories.agent()
    task = factories.task(alice)
    first = task.current_attempt_id
    op = factories.operation(alice, task, step="charge")
    Operation.objects.filter(pk=op.pk).update(status="unresolved")
    second = attempt_create(alice.actor, task.pk, reason="new plan")
    assert _ended(first) == ("unresolved", True)
    third = attempt_create(alice.actor, task.pk)
    assert _ended(second.pk) == ("failed", True)
    assert _ended(third.pk) == ("", False)
    # The replaced attempt's unresolved operation stays where it is, for a person.
    assert Operation.objects.get(pk=op.pk).status == "unresolved"
    assert Operation.objects.get(pk=op.pk).attempt_id == first
