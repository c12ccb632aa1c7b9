"""A Hypothesis stateful test of leasing and acceptance against the real database: claims,
heartbeats, clock advances, expiry sweeps and reports under any generation, in any order. At most
one result is ever accepted, generations strictly increase, and no transition leaves the table."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from runtime.errors import StaleLease
from runtime.leases import Lease, lease_expire_sweep, lease_heartbeat, operation_claim
from runtime.models import Event, Execution, Operation
from runtime.operations import Report, operation_report
from runtime.transitions import OPERATION
from tests import factories

pytestmark: list[pytest.MarkDecorator] = []

REPORTS = {
    "succeeded": Report(outcome="succeeded", result={"ok": True}),
    "transient": Report(outcome="failed", error_kind="transient", message="flaky"),
    "permanent": Report(outcome="failed", error_kind="permanent", message="no"),
    "unknown": Report(outcome="unknown", message="lost response"),
}


class LeasedOperation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        owner = factories.agent()
        task = factories.task(owner)
        self.op = factories.operation(owner, task, max_attempts=4)
        self.execution = Execution.objects.create(host="hypothesis", pid=1).pk
        self.now = timezone.now()
        self.leases: list[Lease] = []
        self.accepted: list[tuple[int, str]] = []

    def _fresh(self) -> Operation:
        return Operation.objects.get(pk=self.op.pk)

    @rule()
    def claim(self) -> None:
        lease = operation_claim(self.op.pk, execution_id=self.execution, now=self.now)
        if isinstance(lease, Lease):
            if self.leases:
                assert lease.lease_generation > self.leases[-1].lease_generation
            self.leases.append(lease)

    @rule(seconds=st.integers(min_value=0, max_value=90))
    def advance_clock(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def sweep_expired_leases(self) -> None:
        lease_expire_sweep(now=self.now)

    @rule(pick=st.integers(min_value=0, max_value=10))
    def heartbeat(self, pick: int) -> None:
        lease = self.leases[pick % len(self.leases)] if self.leases else None
        generation = lease.lease_generation if lease else pick
        before = self._fresh()
        try:
            lease_heartbeat(
                self.op.pk, generation, lease.lease_token if lease else "no claim", now=self.now
            )
        except StaleLease:
            after = self._fresh()
            assert (after.status, after.state_version) == (before.status, before.state_version)
            return
        assert before.status == "running" and before.lease_generation == generation

    @rule(
        pick=st.integers(min_value=0, max_value=10),
        kind=st.sampled_from(sorted(REPORTS)),
        forged=st.booleans(),
    )
    def report(self, pick: int, kind: str, forged: bool) -> None:
        if self.leases:
            lease = self.leases[pick % len(self.leases)]
            generation, version = lease.lease_generation, lease.state_version
            # A forger knows the public generation and version, never the claim's token.
            token = "forged" if forged else lease.lease_token
        else:
            generation, version, token = pick, pick, "no claim"
        before = self._fresh()
        try:
            operation_report(
                self.op.pk,
                lease_generation=generation,
                lease_token=token,
                state_version=version,
                report=REPORTS[kind],
                execution_id=self.execution,
                now=self.now,
            )
        except StaleLease:
            after = self._fresh()
            assert (after.status, after.state_version, after.result) == (
                before.status,
                before.state_version,
                before.result,
            )
            return
        # Accepted: only the current claim (generation and token) at the version it was issued.
        assert not forged
        assert before.status == "running"
        assert before.lease_generation == generation == self.leases[-1].lease_generation
        if kind == "succeeded":
            self.accepted.append((generation, kind))

    @invariant()
    def at_most_one_accepted_result(self) -> None:
        assert len(self.accepted) <= 1
        succeeded = Event.objects.filter(operation_id=self.op.pk, type="operation.succeeded")
        assert succeeded.count() == len(self.accepted)

    @invariant()
    def every_journalled_move_is_in_the_table(self) -> None:
        for data in Event.objects.filter(operation_id=self.op.pk).values_list("data", flat=True):
            if "from" in data:  # transitions; proposals and rejections move nothing
                assert OPERATION.allows(data["from"], data["to"]), data

    @invariant()
    def generation_and_attempts_are_consistent(self) -> None:
        op = self._fresh()
        expected = self.leases[-1].lease_generation if self.leases else 0
        assert op.lease_generation == expected
        assert op.attempts_used == len(self.leases) <= op.max_attempts
        if op.status == "succeeded":
            assert op.result == {"ok": True}


@pytest.mark.django_db
def test_leasing_and_acceptance_hold_their_invariants_under_any_interleaving():
    run_state_machine_as_test(
        LeasedOperation,
        settings=settings(
            max_examples=60,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
