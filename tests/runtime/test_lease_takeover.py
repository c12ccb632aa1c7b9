"""The sweeper's takeover re-checks the lease's expiry in its own guarded statement: a heartbeat
that commits between the sweeper's read and its write keeps the lease (the worker was just told
it holds it). Two claimants racing a claim-time settlement both get a refusal, never an error."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.db import db_now
from runtime.errors import NotClaimable
from runtime.executions import execution_for_agent
from runtime.models import Invocation, Operation
from runtime.transitions.claim import agent_claim, operation_claim
from runtime.transitions.lease import Lease, lease_expire_sweep, lease_heartbeat
from tests import factories
from tests.concurrency import barrier_at, gate_at, in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_heartbeat_inside_the_sweepers_window_keeps_its_lease():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    # The lease ran out on the database's clock (the clock leases are written and taken on).
    late = db_now()
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=late - timedelta(seconds=1))

    with gate_at("sweep.after_read", "sweeper") as gate:
        sweeper, swept = in_thread(lease_expire_sweep, "sweeper")
        assert gate.reached.wait(30), "the sweeper never read the expired lease"
        # The worker heartbeats now, after the sweeper read the row and before it writes.
        expires, cancel = lease_heartbeat(op.pk, 1, lease.lease_token)
        assert expires > late and not cancel
        gate.release()
        sweeper.join(30)

    assert swept.result(timeout=1) == 0
    op.refresh_from_db()
    assert (op.status, op.lease_generation) == ("running", 1)
    assert op.lease_expires_at == expires
    assert Invocation.objects.get(operation=op).outcome is None  # not marked lost


def test_claimants_racing_a_claim_time_settlement_are_both_refused_not_errors(settings):
    # The window is the general claim's (read, then settle): the one-statement claim may lock a
    # claimable row before its guards decline it (whether it does depends on the plan a pooled
    # connection has cached), and the second claimant then waits for the first's commit instead
    # of meeting it in the window. Both ways end in two refusals; this forces the window.
    settings.HOTPATH = False
    owner = factories.agent()
    task = factories.task(owner, deadline_seconds=60)
    op = factories.operation(owner, task, executor="agent", params={"v": 1})
    # The deadline passes while the work waits for its agent.
    Operation.objects.filter(pk=op.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    execution = execution_for_agent(owner.actor.name).pk

    def claim() -> str:
        try:
            agent_claim(op.pk, execution, actor=owner.actor.label)
        except NotClaimable as exc:
            return exc.code
        return "claimed"

    # Both read the operation (past its deadline) before either settles it.
    with barrier_at("claim.after_read", 2):
        threads = [in_thread(claim, f"claimant-{n}") for n in range(2)]
        for thread, _ in threads:
            thread.join(30)
    assert sorted(f.result(timeout=1) for _, f in threads) == ["not_claimable", "not_claimable"]
    assert Operation.objects.get(pk=op.pk).status == "expired"
