"""Many concurrent reservations against one limit never over-admit: several processes, each
with its own PostgreSQL connection, released together by a barrier, propose operations whose
estimates together far exceed the budget. Exactly what fits is admitted."""

from __future__ import annotations

import multiprocessing

import pytest

from runtime.models import BudgetHold, BudgetMeter, Operation
from tests import factories
from tests.conftest import test_database_url as database_url
from tests.processes import propose_many, reserve_many

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROCESSES = 6
PER_PROCESS = 4


def test_concurrent_reservations_from_several_processes_never_over_admit():
    alice = factories.agent()
    # 100 with a 10% cleanup reserve: 90 for ordinary work, 12 holds of 7 (84) fit, 24 are tried.
    task = factories.task(alice, budget={"cost_cents": 100})
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES, timeout=120)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=propose_many,
            args=(
                database_url(),
                alice.actor.agent_id,
                alice.actor.name,
                task.pk,
                f"p{n}",
                PER_PROCESS,
                {"cost_cents": 7},
                barrier,
                out,
            ),
        )
        for n in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    results = [out.get(timeout=10) for _ in procs]
    admitted = sum(a for a, _ in results)
    refused = sum(r for _, r in results)
    assert admitted == 12
    assert refused == PROCESSES * PER_PROCESS - 12
    m = BudgetMeter.objects.get(task=task, meter="cost_cents")
    assert m.reserved == 84
    assert m.reserved + m.posted + m.unknown <= m.limit - m.reserve
    assert Operation.objects.filter(task=task).count() == 12
    assert BudgetHold.objects.filter(meter=m, status="held").count() == 12


def test_the_ledger_statement_alone_never_over_admits_under_concurrent_processes():
    """No task row lock serialises these reservations (unlike proposals, which also append to
    the task's journal): only the guarded UPDATE keeps the sum within the limit."""
    alice = factories.agent()
    task = factories.task(alice, budget={"cost_cents": 1000})  # 900 for ordinary work
    ops = [factories.operation(alice, task, executor="agent") for _ in range(PROCESSES * 10)]
    assert not BudgetHold.objects.exists()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES, timeout=120)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=reserve_many,
            args=(
                database_url(),
                task.pk,
                [o.pk for o in ops[n * 10 : (n + 1) * 10]],
                25,
                barrier,
                out,
            ),
        )
        for n in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    results = [out.get(timeout=10) for _ in procs]
    # 60 holds of 25 are tried against 900: exactly 36 fit.
    assert sum(a for a, _ in results) == 36
    m = BudgetMeter.objects.get(task=task, meter="cost_cents")
    assert m.reserved == 900
    assert BudgetHold.objects.filter(meter=m).count() == 36
