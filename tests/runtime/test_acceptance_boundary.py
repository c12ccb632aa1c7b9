"""Processes that stop around acceptance (docs/guarantees.md, row 1). A proposer that dies before
its commit leaves nothing; one that dies after it, before announcing the work, leaves work the
outbox still delivers. A worker process that dies at the acceptance of its result: with
the acceptance written but not committed, it rolls back and the work stays discoverable, then a
newer generation recovers it by the receiver's contract; just after the commit, before the
message is acknowledged, the redelivery finds the work accepted. Either way one effect at the
receiver and one accepted transition."""

from __future__ import annotations

import multiprocessing

import pytest

from runtime.models import Event, Invocation, Operation, OutboxMessage, RejectedObservation
from runtime.sandbox.models import Charge
from tests import factories
from tests.conftest import test_database_url as database_url
from tests.conftest import wait_for
from tests.processes import propose_and_die

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {
    "LEASE_SECONDS": 3,
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 2,
    "RETRY_BASE_SECONDS": 0.3,
}


def _charge(fault: str) -> Operation:
    owner = factories.agent()
    task = factories.task(owner)
    return factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": "acct", "amount_cents": 700, "_fault": fault},
    )


def test_a_worker_killed_with_its_acceptance_uncommitted_leaves_the_work_to_a_newer_generation(
    workers,
):
    (worker,) = workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    op = _charge("crash_before_accept")
    first = wait_for(
        lambda: Invocation.objects.filter(operation=op, number=1).first(),
        what="the first invocation to start",
    )

    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="a newer generation to recover the work",
    )
    op.refresh_from_db()
    # The dead process's acceptance never committed: the recovery is the newer generation's.
    assert op.lease_generation == 2
    assert first.lease_generation == 1
    invocations = list(Invocation.objects.filter(operation=op).order_by("number"))
    assert [(i.number, i.outcome) for i in invocations] == [
        (1, Invocation.OUTCOME_LOST),
        (2, Invocation.OUTCOME_SUCCEEDED),
    ]
    # The receiver's lookup contract found the first call's charge: one effect, one result.
    charges = list(Charge.objects.filter(key=op.idempotency_key, kind="charge"))
    assert len(charges) == 1
    assert op.result["id"] == charges[0].charge_id
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    assert worker.proc.poll() is None  # the main process replaced its child and goes on


def test_a_worker_killed_after_its_acceptance_committed_is_not_accepted_twice(workers):
    workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    op = _charge("crash_after_accept")
    first = wait_for(
        lambda: Invocation.objects.filter(operation=op, number=1).first(),
        what="the first invocation to start",
    )
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the acceptance to commit",
    )
    # The process died right after the commit, before acknowledging its message: the message
    # is delivered again (to the replacement child) and its claim is refused, which proves the
    # duplicate was consumed before anything is asserted.
    refused = wait_for(
        lambda: RejectedObservation.objects.filter(operation=op, kind="refused_claim").first(),
        timeout=60,
        what="the redelivered message's claim to be refused",
    )
    assert refused.execution_id != first.execution_id
    op.refresh_from_db()
    assert op.lease_generation == 1
    assert Invocation.objects.filter(operation=op).count() == 1
    assert Charge.objects.filter(key=op.idempotency_key, kind="charge").count() == 1
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1


def _propose_in_a_process_that_dies(owner, task, at: str) -> None:
    process = multiprocessing.get_context("spawn").Process(
        target=propose_and_die,
        args=(
            database_url(),
            owner.actor.agent_id,
            owner.actor.name,
            task.pk,
            {"account": "acct", "amount_cents": 300},
            at,
        ),
    )
    process.start()
    process.join(timeout=120)
    assert process.exitcode == 137


def test_a_proposal_whose_process_dies_before_its_commit_is_never_accepted(workers):
    workers.start(count=1, concurrency=1, **FAST)
    owner = factories.agent()
    task = factories.task(owner)
    _propose_in_a_process_that_dies(owner, task, "before_commit")
    # The dead connection's transaction is rolled back: nothing to discover, run or accept.
    assert not Operation.objects.filter(task=task).exists()
    assert not OutboxMessage.objects.filter(operation__task=task).exists()
    assert not Event.objects.filter(task=task, type="operation.proposed").exists()
    # A later proposal of the same intent is a new one, and runs once.
    op = factories.operation(
        owner,
        task,
        step="pay",
        tool="demo.payments.charge",
        params={"account": "acct", "amount_cents": 300},
    )
    wait_for(lambda: Operation.objects.get(pk=op.pk).status == "succeeded", timeout=60)
    assert Charge.objects.filter(key=op.idempotency_key).count() == 1


def test_a_proposal_committed_by_a_process_that_died_before_announcing_it_still_runs_once(
    workers,
):
    workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    _propose_in_a_process_that_dies(owner, task, "after_commit")
    (op,) = Operation.objects.filter(task=task)
    # The announcement never reached the broker; the outbox row committed with the proposal
    # is republished by the sweeper, and a worker runs it.
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the outbox to republish the acknowledged proposal",
    )
    assert Charge.objects.filter(key=op.idempotency_key, kind="charge").count() == 1
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
