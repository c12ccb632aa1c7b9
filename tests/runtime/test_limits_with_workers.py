"""Budgets across real worker processes: a worker restart after usage was recorded neither resets
nor double-counts it; a call lost with its worker leaves its hold unknown while the redispatch
posts its own usage once."""

from __future__ import annotations

import pytest

from runtime.models import BudgetMeter, Invocation, Operation, UsageRecord
from runtime.worker import execute_operation
from tests import factories
from tests.conftest import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {"LEASE_SECONDS": 3, "SWEEP_SECONDS": 1, "OUTBOX_GRACE_SECONDS": 2}


def ledger(task) -> tuple[int, int, int]:
    m = BudgetMeter.objects.get(task=task, meter="cost_cents")
    return m.reserved, m.posted, m.unknown


def test_a_worker_restart_after_usage_was_recorded_neither_resets_nor_double_counts(workers):
    (first,) = workers.start(count=1, concurrency=1, **FAST)
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 100})
    op = factories.operation(
        owner, task, estimate={"cost_cents": 20}, params={"_usage": {"cost_cents": 7}}
    )
    wait_for(lambda: Operation.objects.get(pk=op.pk).status == "succeeded", timeout=60)
    assert ledger(task) == (0, 7, 0)

    first.stop()
    workers.start(count=1, concurrency=1, **FAST)
    # The same delivery again (as Redis redelivers after a restart): nothing to claim.
    execute_operation.apply_async(args=(op.pk, None))
    wait_for(
        lambda: op.rejections.filter(kind="refused_claim").exists(),
        timeout=60,
        what="the redelivery to be refused",
    )
    assert ledger(task) == (0, 7, 0)
    assert UsageRecord.objects.filter(operation=op).count() == 1


def test_a_call_lost_with_its_worker_stays_unknown_and_the_redispatch_posts_once(workers):
    workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 100})
    op = factories.operation(
        owner,
        task,
        estimate={"cost_cents": 20},
        params={"_usage": {"cost_cents": 7}, "_fault": "crash_after_effect"},
    )
    wait_for(lambda: Operation.objects.get(pk=op.pk).status == "succeeded", timeout=90)
    outcomes = list(
        Invocation.objects.filter(operation=op).order_by("number").values_list("outcome", flat=True)
    )
    assert outcomes == ["lost", "succeeded"]
    # The lost call may have cost up to its hold: unknown, apart from the posted usage of the
    # call that finished; nothing held any more.
    assert ledger(task) == (0, 7, 20)
