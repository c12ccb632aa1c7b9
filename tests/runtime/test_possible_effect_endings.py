"""A possible effect is never ended by a machine as anything but ``unresolved`` (issue 34, N4).

The rule is the one status writer's (runtime.transitions.status.operation_transition_txn), so
no caller can forget it: a call lost with its lease is handed back ``pending`` by the sweeper;
when no attempt or deadline is left, the next claim used to end it ``failed`` or ``expired``
although the receiver may hold the charge, with nobody told and its budget hold unknown for
ever. Now the writer writes ``unresolved`` (the reason kept, the unconfirmed call noted),
support staff are told, and what the lost call held stays unknown until a person resolves it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from runtime.actors import SWEEPER, execution_actor
from runtime.executions import execution_for_agent
from runtime.models import BudgetMeter, Event, Invocation, NotificationEvent, Operation
from runtime.resolutions import operation_resolve, unresolved_queue
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from runtime.transitions.status import operation_transition_txn
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True)]

CHARGE = {"tool": "demo.payments.charge", "params": {"account": "acct-1", "amount_cents": 500}}
ECHO = {"tool": "demo.echo", "params": {"v": 1}}


def _worker(name: str = "worker") -> str:
    return execution_for_agent(name).pk


def _lost(owner, task, spec, **extra) -> tuple[Operation, timezone.datetime]:
    """``spec`` proposed, claimed by a worker, its lease run out and taken over by the sweeper
    (the call ``lost``, the work ``pending`` again). Returns it and a time past the lease."""
    op = factories.operation(owner, task, **{**spec, **extra})
    lease = operation_claim(op.pk, execution_id=_worker())
    assert isinstance(lease, Lease)
    late = lease.lease_expires_at + timedelta(seconds=1)
    assert lease_expire_sweep(now=late) == 1
    op.refresh_from_db()
    assert op.status == "pending"
    assert Invocation.objects.get(operation=op).outcome == "lost"
    return op, late


def _meter(task) -> tuple[int, int, int]:
    m = BudgetMeter.objects.get(attempt_id=task.current_attempt_id, meter="cost_cents")
    return m.reserved, m.posted, m.unknown


def _with_a_person(op: Operation, why: str) -> None:
    op.refresh_from_db()
    assert op.status == "unresolved", (op.status, op.status_reason)
    assert why in op.status_reason and "unconfirmed" in op.status_reason, op.status_reason
    assert op.error["kind"] == "unknown"
    assert NotificationEvent.objects.filter(kind="operation_unresolved", operation=op).exists()
    support = factories.console_user("support")
    assert op.pk in {o.pk for o in unresolved_queue(support.actor)}


def test_a_lost_charge_with_no_attempt_left_goes_to_a_person_not_failed():
    """N4 (a): max_attempts 1, the call lost with its lease; the next claim finds no attempt
    left. Before: ``failed`` ("attempts exhausted"), the 50 held by the lost call unknown for
    ever. Now: ``unresolved`` with the reason, support told, the 50 still unknown."""
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 1000})
    op, late = _lost(owner, task, CHARGE, max_attempts=1, estimate={"cost_cents": 50})
    assert _meter(task) == (0, 0, 50)

    claimant = _worker("w2")
    refusal = operation_claim(op.pk, execution_id=claimant, now=late)
    assert isinstance(refusal, Refusal)
    _with_a_person(op, "attempts exhausted")
    assert _meter(task) == (0, 0, 50)  # unknown stays unknown until a person resolves it
    event = Event.objects.filter(operation=op).latest("seq")
    assert event.type == "operation.ended_unconfirmed"
    assert (event.data["from"], event.data["to"], event.data["ending"]) == (
        "pending",
        "unresolved",
        "failed",
    )
    assert event.actor == execution_actor(claimant)

    # The person settles it: the charge stands, the unknown amount is posted.
    support = factories.console_user("support")
    operation_resolve(
        support.actor,
        op.pk,
        resolution="succeeded",
        evidence="the receiver shows the charge",
        state_version=op.state_version,
    )
    assert _meter(task) == (0, 50, 0)

    # A pure call lost the same way simply failed: repeating it was harmless.
    pure, late = _lost(owner, task, ECHO, max_attempts=1)
    assert isinstance(operation_claim(pure.pk, execution_id=claimant, now=late), Refusal)
    pure.refresh_from_db()
    assert (pure.status, pure.status_reason) == ("failed", "attempts exhausted")


def test_a_lost_charge_past_its_deadline_goes_to_a_person_not_expired():
    """N4 (b): the deadline passes while the lost call's work waits for its re-dispatch.
    Before: ``expired`` ("before the work could start"). Now: ``unresolved``."""
    owner = factories.agent()
    task = factories.task(owner, deadline_seconds=600, budget={"cost_cents": 1000})
    op, _ = _lost(owner, task, CHARGE, estimate={"cost_cents": 50})
    past = task.deadline + timedelta(seconds=1)

    refusal = operation_claim(op.pk, execution_id=_worker("w2"), now=past)
    assert isinstance(refusal, Refusal)
    _with_a_person(op, "the deadline passed")
    assert _meter(task) == (0, 0, 50)
    assert Event.objects.filter(operation=op).latest("seq").data["ending"] == "expired"


def _end(op: Operation, target: str, actor: str) -> Operation:
    with transaction.atomic():
        current = Operation.objects.get(pk=op.pk)
        operation_transition_txn(
            current,
            target,
            now=timezone.now(),
            actor=actor,
            fields={"status_reason": f"asked for {target}"},
        )
    return Operation.objects.get(pk=op.pk)


MACHINES_AND_PEOPLE = [execution_actor("exe_w"), SWEEPER, "agent:someone", "user:operator-1"]


@pytest.mark.parametrize("actor", MACHINES_AND_PEOPLE)
@pytest.mark.parametrize("target", ["failed", "expired", "cancelled"])
def test_the_one_writer_never_ends_a_lost_charge_otherwise_whoever_asks(target, actor):
    """(c) The rule lives in the writer: whatever the caller and whoever the actor, an ending
    over a lost call of a tool with effects is written ``unresolved``, the ending asked for and
    its reason kept in the journal."""
    owner = factories.agent()
    task = factories.task(owner)
    op, _ = _lost(owner, task, CHARGE)

    ended = _end(op, target, actor)
    assert ended.status == "unresolved"
    assert ended.status_reason.startswith(f"asked for {target}; ")
    event = Event.objects.filter(operation=op).latest("seq")
    assert (event.type, event.actor, event.data["ending"]) == (
        "operation.ended_unconfirmed",
        actor,
        target,
    )
    assert NotificationEvent.objects.filter(kind="operation_unresolved", operation=op).exists()

    # Where nothing is to be feared the ending is written as asked: a pure call lost the same
    # way, and a charge that never made a call.
    pure, _ = _lost(owner, task, ECHO)
    assert _end(pure, target, actor).status == target
    uncalled = factories.operation(owner, task, **CHARGE)
    if target != "expired":  # (pending work expires only at its claim, past a deadline)
        assert _end(uncalled, target, actor).status == target


def _claim(op: Operation) -> Lease:
    lease = operation_claim(op.pk, execution_id=_worker("w2"), now=timezone.now())
    assert isinstance(lease, Lease)
    return lease


def _report(op: Operation, lease: Lease, report: Report) -> Operation:
    return operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=report,
        execution_id=None,
        snapshot=lease.operation,
    )


FAILED = Report(outcome="failed", error_kind="permanent", message="card declined")


@pytest.mark.parametrize("fast", [True, False], ids=["statement", "general"])
def test_a_failure_reported_after_a_lost_call_goes_to_a_person(fast, settings):
    """The re-dispatch of a lost call fails: the lost call's outcome is still unconfirmed, so
    the writer hands it to a person; the one-statement acceptance declines to it (it reads no
    earlier call) rather than writing ``failed``. A worker's report confirms its own call (the
    outcome is recorded with the transition): a first call that failed is simply ``failed``.
    Out of ``unresolved`` a person may still end it: no effect is ``failed``."""
    settings.HOTPATH = fast
    owner = factories.agent()
    task = factories.task(owner)
    op, _ = _lost(owner, task, CHARGE)
    accepted = _report(op, _claim(op), FAILED)
    assert accepted.status == "unresolved"
    assert accepted.status_reason.endswith("a person decides")
    outcomes = dict(Invocation.objects.filter(operation=op).values_list("number", "outcome"))
    assert outcomes == {1: "lost", 2: "failed_permanent"}

    first = factories.operation(owner, task, **CHARGE)
    assert _report(first, _claim(first), FAILED).status == "failed"
    assert Invocation.objects.get(operation=first).outcome == "failed_permanent"

    support = factories.console_user("support")
    resolved = operation_resolve(
        support.actor,
        op.pk,
        resolution="no_effect",
        evidence="the receiver declined the card",
        state_version=accepted.state_version,
    )
    assert resolved.status == "failed"
