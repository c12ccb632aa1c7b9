"""Budgets as ledgers: atomic reservation at admission, settlement to observed usage (adapter and
agent), unknown usage kept apart and settled by a person, expired holds never free, idempotent
usage recording, the cleanup reserve, and the ledger's silence for tasks without a budget."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from runtime.budgets import budget_reserve_txn, budget_settle_txn
from runtime.errors import BudgetExhausted
from runtime.executor import operation_execute
from runtime.models import BudgetHold, BudgetMeter, Operation, UsageRecord
from runtime.resolutions import operation_resolve
from runtime.transitions.accept import agent_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import agent_claim
from runtime.transitions.lease import lease_expire_sweep
from tests import factories


def exe(label: str) -> str:
    from runtime.models import Execution

    return Execution.objects.create(kind="agent", host="test", label=label).pk


pytestmark = pytest.mark.django_db


def meter(task, name="cost_cents") -> BudgetMeter:
    return BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter=name)


def amounts(task, name="cost_cents") -> tuple[int, int, int]:
    m = meter(task, name)
    return m.reserved, m.posted, m.unknown


def test_admission_holds_the_estimate_and_a_refusal_changes_nothing():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    factories.operation(alice, task, estimate={"cost_cents": 60})
    assert amounts(task) == (60, 0, 0)
    ops = Operation.objects.count()
    # 60 + 40 > 90: the 10% cleanup reserve is not for ordinary work.
    with pytest.raises(BudgetExhausted):
        factories.operation(alice, task, estimate={"cost_cents": 40})
    assert amounts(task) == (60, 0, 0)
    assert Operation.objects.count() == ops
    assert BudgetHold.objects.count() == 1


def test_adapter_usage_replaces_the_hold():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100, "tool_calls": 5})
    op = factories.operation(
        alice, task, estimate={"cost_cents": 50}, params={"_usage": {"cost_cents": 7}}
    )
    assert amounts(task) == (50, 0, 0)
    assert amounts(task, "tool_calls") == (1, 0, 0)
    assert operation_execute(op.pk) == "succeeded"
    assert amounts(task) == (0, 7, 0)
    assert amounts(task, "tool_calls") == (0, 1, 0)
    record = UsageRecord.objects.get(meter=meter(task), operation=op)
    assert (record.amount, record.source, record.number) == (7, "adapter", 1)


def test_agent_reported_usage_in_complete_is_posted():
    alice = factories.agent()
    task = factories.task(alice, budget={"model_tokens": 1000})
    op = factories.operation(alice, task, executor="agent", estimate={"model_tokens": 400})
    lease = agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    agent_report(
        op,
        actor=alice.actor.label,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        report=Report(outcome="succeeded", result={}, usage={"model_tokens": 321.2}),
    )
    # Fractions round up: never under-count.
    assert amounts(task, "model_tokens") == (0, 322, 0)


def test_recording_usage_twice_for_one_invocation_posts_it_once():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    op = factories.operation(alice, task, executor="agent", estimate={"cost_cents": 10})
    for _ in range(2):  # a replayed report, a restarted worker reporting again
        with transaction.atomic():
            budget_settle_txn(
                budget=task.budget,
                op=op,
                number=1,
                usage={"cost_cents": 9},
                outcome="succeeded",
                final=True,
                source="adapter",
                actor="test",
                now=timezone.now(),
            )
    assert amounts(task) == (0, 9, 0)
    assert UsageRecord.objects.filter(operation=op).count() == 1


def test_lost_usage_is_unknown_and_a_person_settles_it():
    alice = factories.agent()
    support = factories.console_user("support")
    task = factories.task(alice, budget={"cost_cents": 100})
    op = factories.operation(
        alice,
        task,
        tool="demo.notify",
        params={"to": "ops", "message": "hi", "_fault": "unknown"},
        estimate={"cost_cents": 30},
    )
    operation_execute(op.pk)
    op.refresh_from_db()
    assert op.status == "unresolved"
    # A possible liability, apart from posted usage; not available to new work.
    assert amounts(task) == (0, 0, 30)
    with pytest.raises(BudgetExhausted):
        factories.operation(alice, task, estimate={"cost_cents": 61})
    operation_resolve(
        support.actor,
        op.pk,
        resolution="succeeded",
        evidence="the message is in the channel",
        state_version=op.state_version,
    )
    assert amounts(task) == (0, 30, 0)
    assert UsageRecord.objects.get(operation=op).source == "person"


def test_a_person_saying_no_effect_releases_the_unknown_amount():
    alice = factories.agent()
    support = factories.console_user("support")
    task = factories.task(alice, budget={"cost_cents": 100})
    op = factories.operation(
        alice,
        task,
        tool="demo.notify",
        params={"to": "ops", "_fault": "unknown"},
        estimate={"cost_cents": 30},
    )
    operation_execute(op.pk)
    op.refresh_from_db()
    operation_resolve(
        support.actor,
        op.pk,
        resolution="no_effect",
        evidence="nothing arrived",
        state_version=op.state_version,
    )
    assert amounts(task) == (0, 0, 0)


def test_an_expired_hold_is_never_free_and_the_next_call_holds_anew():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    op = factories.operation(alice, task, executor="agent", estimate={"cost_cents": 40})
    lease = agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    assert lease_expire_sweep(now=timezone.now() + timedelta(hours=1)) == 1
    # The lost call may have spent its hold: unknown, not available.
    assert amounts(task) == (0, 0, 40)
    lease2 = agent_claim(op.pk, exe("exe_agent_2"), actor=alice.actor.label)
    assert amounts(task) == (40, 0, 40)
    agent_report(
        op,
        actor=alice.actor.label,
        lease_generation=lease2.lease_generation,
        lease_token=lease2.lease_token,
        report=Report(outcome="succeeded", result={}, usage={"cost_cents": 15}),
    )
    # Pure work: the lost call's usage stays unknown (it may have cost), the new one is posted.
    assert amounts(task) == (0, 15, 40)
    assert lease.lease_generation < lease2.lease_generation


def test_a_redispatch_that_cannot_hold_again_does_not_start():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    op = factories.operation(alice, task, executor="agent", estimate={"cost_cents": 50})
    agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    lease_expire_sweep(now=timezone.now() + timedelta(hours=1))
    factories.operation(alice, task, estimate={"cost_cents": 40})  # 50 unknown + 40 held
    with pytest.raises(Exception, match="not claimable"):
        agent_claim(op.pk, exe("exe_agent_2"), actor=alice.actor.label)
    op.refresh_from_db()
    assert op.status == "failed"
    assert op.error["kind"] == "budget_exhausted"
    assert amounts(task) == (40, 0, 50)


def test_the_cleanup_reserve_is_kept_from_ordinary_work_but_not_from_cleanup():
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    assert meter(task).reserve == 10
    factories.operation(alice, task, estimate={"cost_cents": 90})
    with pytest.raises(BudgetExhausted):
        factories.operation(alice, task, estimate={"cost_cents": 1})
    cleanup = factories.operation(alice, factories.task(alice), estimate={})
    cleanup.attempt_id = task.current_attempt_id
    cleanup.estimate = {"cost_cents": 10}
    with transaction.atomic():
        budget_reserve_txn(
            budget=task.budget, op=cleanup, number=7, now=timezone.now(), cleanup=True
        )
    assert amounts(task) == (100, 0, 0)


def test_a_compensation_holds_its_estimate_from_the_cleanup_reserve():
    from runtime.compensation import compensation_start_txn
    from runtime.models import BudgetHold, Operation

    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 100})
    charge = factories.operation(
        alice,
        task,
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 5},
        estimate={"cost_cents": 8},
    )
    Operation.objects.filter(pk=charge.pk).update(status="succeeded", result={"id": "ch_1"})
    factories.operation(alice, task, estimate={"cost_cents": 82})  # ordinary work: 90 in all
    with pytest.raises(BudgetExhausted):
        factories.operation(alice, task, estimate={"cost_cents": 1})
    charge.refresh_from_db()
    with transaction.atomic():
        refund = compensation_start_txn(charge, actor="system:saga", now=timezone.now())
    # The undo is held out of the reserve ordinary work could not touch.
    assert BudgetHold.objects.get(operation=refund, status="held").amount == 8
    assert meter(task).reserved == 98


def test_an_unbudgeted_task_costs_the_ledger_no_statement(django_assert_num_queries):
    alice = factories.agent()
    task = factories.task(alice)
    op = factories.operation(alice, task, estimate={"cost_cents": 10})
    with transaction.atomic(), django_assert_num_queries(0):
        budget_reserve_txn(budget=task.budget, op=op, number=0, now=timezone.now())
        budget_settle_txn(
            budget=task.budget,
            op=op,
            number=1,
            usage={"cost_cents": 3},
            outcome="succeeded",
            final=True,
            source="adapter",
            actor="t",
            now=timezone.now(),
        )
    assert not BudgetMeter.objects.exists()


class _Longest:
    """An rng that always draws the longest backoff its envelope allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_backoff_that_would_pass_the_deadline_is_not_scheduled(settings):
    from runtime.transitions.accept import operation_report

    settings.RETRY_BASE_SECONDS = 120
    settings.RETRY_CAP_SECONDS = 120
    alice = factories.agent()
    task = factories.task(alice, deadline_seconds=60, budget={"cost_cents": 100})
    op = factories.operation(alice, task, executor="agent", estimate={"cost_cents": 10})
    lease = agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="failed", error_kind="transient", message="flaky"),
        execution_id=None,
        rng=_Longest(),  # type: ignore[arg-type]
    )
    op.refresh_from_db()
    assert op.status == "failed"
    assert "no retry fits before the deadline" in op.error["message"]
    assert op.next_attempt_at is None
    # Settled for good: the hold is released.
    assert amounts(task) == (0, 0, 0)


def _fail_transiently(op, lease, usage):
    from runtime.transitions.accept import operation_report

    operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="failed", error_kind="transient", message="flaky", usage=usage),
        execution_id=None,
        rng=_Longest(),  # type: ignore[arg-type]
    )
    op.refresh_from_db()


def test_a_retrys_call_is_settled_and_the_next_call_holds_anew_at_dispatch(settings):
    settings.RETRY_BASE_SECONDS = 1
    alice = factories.agent()
    task = factories.task(alice, deadline_seconds=600, budget={"cost_cents": 100})
    op = factories.operation(alice, task, executor="agent", estimate={"cost_cents": 10})
    lease = agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    _fail_transiently(op, lease, {"cost_cents": 2})
    assert op.status == "retry_scheduled"
    # The call is over: its usage posted, its hold released (no double count of one call).
    assert amounts(task) == (0, 2, 0)
    Operation.objects.filter(pk=op.pk).update(next_attempt_at=timezone.now())
    agent_claim(op.pk, exe("exe_agent_2"), actor=alice.actor.label)
    assert amounts(task) == (10, 2, 0)
    assert BudgetHold.objects.get(operation=op, status="held").number == 2


def test_a_retry_the_ledger_cannot_cover_fails_instead_of_passing_the_limit(settings):
    """Call 1 failed after spending 45 of the 90 ordinary work may use; call 2 needs its 50
    again. The retry does not start: it failed (every earlier call's outcome is known, so there
    is nothing for a person to settle), and the meter never shows more than its limit."""
    settings.RETRY_BASE_SECONDS = 1
    alice = factories.agent()
    task = factories.task(alice, deadline_seconds=600, budget={"cost_cents": 100})
    op = factories.operation(alice, task, executor="agent", estimate={"cost_cents": 50})
    lease = agent_claim(op.pk, exe("exe_agent"), actor=alice.actor.label)
    _fail_transiently(op, lease, {"cost_cents": 45})
    assert op.status == "retry_scheduled"
    Operation.objects.filter(pk=op.pk).update(next_attempt_at=timezone.now())
    with pytest.raises(Exception, match="not claimable"):
        agent_claim(op.pk, exe("exe_agent_2"), actor=alice.actor.label)
    op.refresh_from_db()
    assert op.status == "failed"
    assert op.error["kind"] == "budget_exhausted"
    assert amounts(task) == (0, 45, 0)
    m = meter(task)
    assert m.reserved + m.posted + m.unknown <= m.limit - m.reserve


def test_tasks_near_a_limit_are_found_in_the_database_fullest_first():
    from runtime.selectors.budgets import tasks_near_limit

    alice = factories.agent()
    tasks = {}
    for name, held in (("half", 50), ("most", 85), ("full", 90), ("nearly", 80)):
        tasks[name] = factories.task(alice, name, budget={"cost_cents": 100})
        factories.operation(alice, tasks[name], estimate={"cost_cents": held})
    near = tasks_near_limit(threshold=0.8, limit=2)
    assert [(t, m) for t, m, _ in near] == [
        (tasks["full"].pk, "cost_cents"),
        (tasks["most"].pk, "cost_cents"),
    ]
    assert near[0][2] == pytest.approx(0.9)
    assert {t for t, _, _ in tasks_near_limit(threshold=0.8)} == {
        tasks[n].pk for n in ("full", "most", "nearly")
    }
