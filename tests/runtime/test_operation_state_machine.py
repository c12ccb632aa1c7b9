"""A Hypothesis stateful test of leasing and acceptance against the real database: claims,
heartbeats, clock advances, expiry sweeps and reports under any generation, in any order. At most
one result is ever accepted, generations strictly increase, and no transition leaves the table.

Every event the task journals is checked after every step, whichever path wrote it (the
one-statement claim and acceptance on PostgreSQL, the general path on both databases): its seq
follows the last one without a gap, it names its actor and a known type, and an operation's move
carries ``from`` and ``to`` naming an edge of ``runtime.rules.statuses.OPERATION`` that its type
journals, ``from`` being where the previous move left the operation. The run runs twice, with the
one-statement forms on (``HOTPATH``, PostgreSQL only) and off, and counts the claims and the
acceptances each form made: a run in which they did not happen proves nothing and fails."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runtime import dialect
from runtime.errors import StaleLease
from runtime.models import Event, Execution, Operation, Task
from runtime.rules.statuses import OPERATION
from runtime.transitions import accept as accept_module
from runtime.transitions import claim as claim_module
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease, lease_expire_sweep, lease_heartbeat
from tests import factories

REPORTS = {
    "succeeded": Report(outcome="succeeded", result={"ok": True}),
    "transient": Report(outcome="failed", error_kind="transient", message="flaky"),
    "permanent": Report(outcome="failed", error_kind="permanent", message="no"),
    "unknown": Report(outcome="unknown", message="lost response"),
}

# Operation events that move nothing: they carry no "from" (the creation states where the
# operation starts in "status").
NON_MOVES = {"operation.proposed", "operation.report_rejected"}
# A move is journalled under its edge's name, except the sweeper's takeover, which journals every
# edge it takes under one type.
EDGE_TYPES = {
    "operation.lease_expired": {"lease_expired", "outcome_unknown", "cancel_acknowledged"}
}
EVENT_TYPE = re.compile(r"^[a-z_]+\.[a-z_]+$")

EXAMPLES = 60
STEPS = 25
# What a run must at least have done for its checks to mean anything. Hypothesis draws short
# and long examples alike: runs make 25 to 60 claims and 14 to 40 acceptances; the floors leave
# room for its choices and fail a run in which claims or acceptances (of the form under test)
# did not really happen.
MIN_CLAIMS = 10
MIN_ACCEPTANCES = 5


def check_journal(task_id: str) -> int:
    """Check every event of the task's journal; returns how many operation moves it holds."""
    task = Task.objects.get(pk=task_id)
    events = list(Event.objects.filter(task_id=task_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "journal has a gap"
    assert task.event_seq == len(events), (task.event_seq, len(events))
    status: dict[str, str] = {}
    version: dict[str, int] = {}
    moves = 0
    for e in events:
        where = (e.seq, e.type, e.data)
        assert e.actor, where
        assert EVENT_TYPE.match(e.type), where
        if e.operation_id is None:
            assert not e.type.startswith("operation."), where
            continue
        assert e.type.startswith("operation."), where
        if e.type == "operation.proposed":
            assert e.operation_id not in status, where
            assert "from" not in e.data, where
            status[e.operation_id] = e.data["status"]
            version[e.operation_id] = e.state_version
            continue
        assert e.operation_id in status, f"event before its operation's proposal: {where}"
        if e.type in NON_MOVES:
            assert "from" not in e.data and "to" not in e.data, where
            continue
        # A move: it names both ends, they are an edge of the table, the type journals that
        # edge, and it starts where the last move ended, one state version on.
        assert "from" in e.data and "to" in e.data, f"a move without its ends: {where}"
        assert e.data["status"] == e.data["to"], where
        assert OPERATION.allows(e.data["from"], e.data["to"]), where
        edge = OPERATION.check(e.data["from"], e.data["to"])
        assert e.type == f"operation.{edge}" or edge in EDGE_TYPES.get(e.type, ()), where
        assert e.data["from"] == status[e.operation_id], (status[e.operation_id], where)
        assert e.state_version == version[e.operation_id] + 1, (version[e.operation_id], where)
        status[e.operation_id] = e.data["to"]
        version[e.operation_id] = e.state_version
        moves += 1
    # The journal ends where the rows are.
    for op_id, last in status.items():
        op = Operation.objects.get(pk=op_id)
        assert (op.status, op.state_version) == (last, version[op_id]), op_id
    return moves


def counting(tally: Counter[str], name: str, form: Callable[..., Any]) -> Callable[..., Any]:
    """``form`` as it is, counting the calls that wrote (a one-statement form returns None when
    it leaves the case to the general path)."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = form(*args, **kwargs)
        if result is not None:
            tally[name] += 1
        return result

    return counted


class LeasedOperation(RuleBasedStateMachine):
    tally: Counter[str] = Counter()

    def __init__(self) -> None:
        super().__init__()
        owner = factories.agent()
        task = factories.task(owner)
        self.op = factories.operation(owner, task, max_attempts=4)
        self.execution = Execution.objects.create(host="hypothesis", pid=1).pk
        self.now = timezone.now()
        self.leases: list[Lease] = []
        self.accepted: list[tuple[int, str]] = []
        self.tally["runs"] += 1

    def _fresh(self) -> Operation:
        return Operation.objects.get(pk=self.op.pk)

    @rule()
    def claim(self) -> None:
        before = self._fresh()
        # What must happen: due, claimable work with attempts left is claimed; nothing else is.
        due = before.next_attempt_at is None or before.next_attempt_at <= self.now
        claimable = before.status in ("pending", "retry_scheduled") and due
        expected = claimable and before.attempts_used < before.max_attempts
        lease = operation_claim(self.op.pk, execution_id=self.execution, now=self.now)
        assert isinstance(lease, Lease) == expected, (before.status, lease)
        if isinstance(lease, Lease):
            if self.leases:
                assert lease.lease_generation > self.leases[-1].lease_generation
            self.leases.append(lease)
            self.tally["claims"] += 1

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
            # Refused only when the claim is not the current one.
            current = before.status == "running" and before.lease_generation == generation
            assert not (lease and current), "the current claim's heartbeat was refused"
            return
        assert before.status == "running" and before.lease_generation == generation

    @rule(
        pick=st.integers(min_value=0, max_value=10),
        kind=st.sampled_from(sorted(REPORTS)),
        forged=st.booleans(),
    )
    def report(self, pick: int, kind: str, forged: bool) -> None:
        snapshot = None
        if self.leases:
            lease = self.leases[pick % len(self.leases)]
            generation, version = lease.lease_generation, lease.state_version
            # A forger knows the public generation and version, never the claim's token.
            token = "forged" if forged else lease.lease_token
            # The worker's copy of the claim, as a worker reports: on PostgreSQL (HOTPATH) the
            # common acceptance is then the one statement.
            snapshot = lease.operation
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
                snapshot=snapshot,
                now=self.now,
            )
        except StaleLease:
            after = self._fresh()
            assert (after.status, after.state_version, after.result) == (
                before.status,
                before.state_version,
                before.result,
            )
            # Refused only when forged or not the current claim: the honest worker of the
            # running claim is always heard.
            current = (before.status, before.lease_generation, before.state_version) == (
                "running",
                generation,
                version,
            )
            assert forged or not snapshot or not current, "the current claim's report was refused"
            return
        # Accepted: only the current claim (generation and token) at the version it was issued.
        assert not forged
        assert before.status == "running"
        assert before.lease_generation == generation == self.leases[-1].lease_generation
        self.tally["acceptances"] += 1
        if self._fresh().status == "unresolved":
            # A person must hear of it: that acceptance is the general writer's by design
            # (runtime.transitions.accept.accept_fast_txn declines it), never the one statement's.
            self.tally["acceptances ending unresolved"] += 1
        if kind == "succeeded":
            self.accepted.append((generation, kind))

    @precondition(lambda self: self.leases)
    @rule(kind=st.sampled_from(sorted(REPORTS)))
    def report_as_the_current_worker(self, kind: str) -> None:
        # The honest worker of the latest claim, so that acceptances are common, not rare.
        self.report(len(self.leases) - 1, kind, forged=False)

    @invariant()
    def at_most_one_accepted_result(self) -> None:
        assert len(self.accepted) <= 1
        succeeded = Event.objects.filter(operation_id=self.op.pk, type="operation.succeeded")
        assert succeeded.count() == len(self.accepted)

    @invariant()
    def every_event_is_well_formed_and_every_move_in_the_table(self) -> None:
        self.tally["moves checked"] += check_journal(self.op.task_id)

    @invariant()
    def generation_and_attempts_are_consistent(self) -> None:
        op = self._fresh()
        expected = self.leases[-1].lease_generation if self.leases else 0
        assert op.lease_generation == expected
        assert op.attempts_used == len(self.leases) <= op.max_attempts
        if op.status == "succeeded":
            assert op.result == {"ok": True}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "one_statement",
    [
        pytest.param(True, marks=pytest.mark.postgres, id="one-statement"),
        pytest.param(False, id="general"),
    ],
)
def test_leasing_and_acceptance_hold_their_invariants_under_any_interleaving(
    one_statement: bool, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.HOTPATH = one_statement
    tally: Counter[str] = Counter()
    monkeypatch.setattr(LeasedOperation, "tally", tally)
    monkeypatch.setattr(
        claim_module, "claim_txn", counting(tally, "fast claims", claim_module.claim_txn)
    )
    monkeypatch.setattr(
        accept_module, "accept_txn", counting(tally, "fast acceptances", accept_module.accept_txn)
    )
    run_state_machine_as_test(
        LeasedOperation,
        settings=hsettings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
    print(dict(tally))
    assert tally["claims"] >= MIN_CLAIMS, tally
    assert tally["acceptances"] >= MIN_ACCEPTANCES, tally
    if one_statement:
        # Every claim and acceptance here is the common case: the one statement made them all,
        assert dialect.one_statement_forms()
        assert tally["fast claims"] == tally["claims"], tally
        # ...but one ending unresolved, which the general writer takes (and notes for people).
        assert (
            tally["fast acceptances"]
            == tally["acceptances"] - tally["acceptances ending unresolved"]
        ), tally
    else:
        # The general path alone: the one-statement forms never wrote.
        assert tally["fast claims"] == tally["fast acceptances"] == 0, tally
