"""The two-person rule (issue 39): a tool's policy says how many distinct people must approve a
gated call (the demo charge: two above 100000 cents), fixed on the approval when it is requested.
Each approve is a vote, unique per (approval, approver) in the database; the request stays
pending until the votes reach the count, then becomes approved once; a deny by anyone denies; an
edit starts over; the release gate asks every voter's right and the seal covers the votes. The
races run on real concurrent PostgreSQL transactions; the rest on SQLite too."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps as live_apps
from django.contrib.auth.models import Group
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runtime.approval_expiry import approval_expire_sweep, approval_renew
from runtime.approvals import approval_decide, approval_edit
from runtime.errors import ApprovalAlreadyApproved, ApprovalDecided
from runtime.executions import execution_for_agent
from runtime.models import Approval, ApprovalVote, Event, Operation, OutboxMessage
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock

TWO = {"account": "acct-2p", "amount_cents": 250000}  # above 100000: two approvers
ONE = {"account": "acct-1p", "amount_cents": 25000}  # above 10000 only: one approver


def _gated(owner, params=TWO):
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.payments.charge", params=dict(params))
    return op, Approval.objects.get(operation=op)


def _approve(who, approval, params_hash=None):
    return approval_decide(
        who.actor,
        approval.pk,
        decision="approve",
        reason=f"{who.actor.label} checked",
        params_hash=params_hash or approval.params_hash,
    )


def _claim(op):
    return operation_claim(op.pk, execution_id=execution_for_agent("worker").pk)


def _voters(approval):
    return list(
        ApprovalVote.objects.filter(approval=approval)
        .order_by("voted_at", "id")
        .values_list("approver", flat=True)
    )


def _state(op, approval):
    op.refresh_from_db()
    approval.refresh_from_db()
    return approval.status, op.status


@pytest.mark.django_db
def test_two_distinct_approvers_release_it_and_each_vote_is_journalled_with_its_actor():
    owner = factories.agent()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    op, approval = _gated(owner)
    assert approval.approvals_required == 2

    first = _approve(alice, approval)

    assert first.status == "pending"
    assert _state(op, approval) == ("pending", "waiting_approval")
    assert _voters(approval) == [alice.actor.label]
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert isinstance(_claim(op), Refusal)  # one approval releases nothing
    voted = Event.objects.get(operation=op, type="approval.voted")
    assert voted.actor == alice.actor.label
    assert voted.data["approved_by"] == [alice.actor.label]
    assert (voted.data["approvals"], voted.data["approvals_required"]) == (1, 2)

    second = _approve(bob, approval)

    assert second.status == "approved" and second.decided_by == bob.actor.label
    assert _state(op, approval) == ("approved", "pending")
    assert _voters(approval) == [alice.actor.label, bob.actor.label]
    approved = Event.objects.get(operation=op, type="approval.approved")
    assert approved.actor == bob.actor.label
    assert approved.data["approved_by"] == [alice.actor.label, bob.actor.label]
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    assert isinstance(_claim(op), Lease)
    assert _state(op, approval) == ("released", "running")


@pytest.mark.django_db
def test_one_approver_approving_twice_counts_once():
    owner, alice = factories.agent(), factories.console_user("operator")
    op, approval = _gated(owner)
    _approve(alice, approval)

    with pytest.raises(ApprovalAlreadyApproved) as refused:
        _approve(alice, approval)

    assert refused.value.status == 409 and refused.value.code == "approval_already_approved"
    assert "1 of 2 approvals" in refused.value.message
    assert _state(op, approval) == ("pending", "waiting_approval")
    assert _voters(approval) == [alice.actor.label]
    assert Event.objects.filter(operation=op, type="approval.voted").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_a_second_vote_by_the_same_person():
    owner, alice = factories.agent(), factories.console_user("operator")
    _, approval = _gated(owner)
    _approve(alice, approval)
    with pytest.raises(IntegrityError), transaction.atomic():
        ApprovalVote.objects.create(
            approval=approval,
            approver=alice.actor.label,
            approver_key=alice.actor.key,
            voted_at=timezone.now(),
        )


def _at_once(first, second):
    """``first`` stops holding the gate's locks; ``second`` starts and waits for them (seen in
    pg_stat_activity); then both finish. Their results (or exceptions), in that order."""
    with gate_at("approval.gate_locked", "first") as gate:
        a, a_result = in_thread(first, "first")
        assert gate.reached.wait(30), "the first decision never reached its locks"
        b, b_result = in_thread(second, "second")
        wait_until_blocked_on_a_lock("the second decision to wait for the first's locks")
        gate.release()
        for t in (a, b):
            t.join(timeout=30)
    return a_result, b_result


def _outcome(future):
    try:
        return future.result(timeout=1).status
    except (ApprovalAlreadyApproved, ApprovalDecided) as exc:
        return exc.code


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_person_approving_twice_at_once_counts_once():
    owner, alice = factories.agent(), factories.console_user("operator")
    op, approval = _gated(owner)

    a, b = _at_once(lambda: _approve(alice, approval), lambda: _approve(alice, approval))

    assert (_outcome(a), _outcome(b)) == ("pending", "approval_already_approved")
    assert _state(op, approval) == ("pending", "waiting_approval")
    assert _voters(approval) == [alice.actor.label]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_distinct_approvers_at_once_both_count_and_it_is_approved_once():
    owner = factories.agent()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    op, approval = _gated(owner)

    a, b = _at_once(lambda: _approve(alice, approval), lambda: _approve(bob, approval))

    # The first vote is recorded and leaves it pending; the second, serialised behind it on the
    # row locks, reads that vote and makes it approved.
    assert (_outcome(a), _outcome(b)) == ("pending", "approved")
    assert _state(op, approval) == ("approved", "pending")
    assert _voters(approval) == [alice.actor.label, bob.actor.label]
    assert Event.objects.filter(operation=op, type="approval.approved").count() == 1
    assert OutboxMessage.objects.filter(operation=op).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_third_approver_arriving_after_the_second_is_refused_and_not_counted():
    owner = factories.agent()
    alice, bob, carol = (factories.console_user("operator") for _ in range(3))
    op, approval = _gated(owner)
    _approve(alice, approval)

    b, c = _at_once(lambda: _approve(bob, approval), lambda: _approve(carol, approval))

    assert (_outcome(b), _outcome(c)) == ("approved", "approval_decided")
    assert _state(op, approval) == ("approved", "pending")
    assert _voters(approval) == [alice.actor.label, bob.actor.label]
    assert OutboxMessage.objects.filter(operation=op).count() == 1


@pytest.mark.django_db
def test_a_deny_after_one_approval_denies_it():
    owner = factories.agent()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    op, approval = _gated(owner)
    _approve(alice, approval)

    approval_decide(bob.actor, approval.pk, decision="deny", reason="too much", params_hash="")

    assert _state(op, approval) == ("denied", "failed")
    denied = Event.objects.get(operation=op, type="approval.denied")
    assert denied.actor == bob.actor.label and denied.data["approved_by"] == [alice.actor.label]
    with pytest.raises(ApprovalDecided):
        _approve(factories.console_user("operator"), approval)
    assert not OutboxMessage.objects.filter(operation=op).exists()


@pytest.mark.django_db
def test_an_edit_starts_over_with_no_vote_and_never_asks_fewer_approvers():
    owner = factories.agent()
    alice, editor = factories.console_user("operator"), factories.console_user("operator")
    _op, approval = _gated(owner)
    _approve(alice, approval)

    # Lowered below the two-person threshold: the request in flight keeps its rule.
    lowered = approval_edit(
        editor.actor, approval.pk, params={**TWO, "amount_cents": 50000}, reason="less"
    )

    assert lowered.approvals_required == 2 and _voters(lowered) == []
    assert _approve(alice, lowered).status == "pending"  # alice's earlier vote does not carry
    assert _voters(lowered) == [alice.actor.label]
    # And a one-approver request edited above the threshold asks two.
    op_one, one = _gated(owner, ONE)
    assert one.approvals_required == 1
    raised = approval_edit(editor.actor, one.pk, params={**ONE, "amount_cents": 300000}, reason="")
    assert raised.approvals_required == 2
    assert _approve(alice, raised).status == "pending"
    assert _state(op_one, raised) == ("pending", "waiting_approval")


@pytest.mark.django_db
def test_an_approver_losing_the_right_before_release_loses_the_vote_and_it_waits_again():
    owner = factories.agent()
    alice, bob, carol = (factories.console_user("operator") for _ in range(3))
    op, approval = _gated(owner)
    _approve(alice, approval)
    _approve(bob, approval)
    bob.actor_user().groups.remove(Group.objects.get(name="operator"))

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    assert _state(op, approval) == ("pending", "waiting_approval")
    assert _voters(approval) == [alice.actor.label]  # alice still holds the right: hers stands
    reopened = Event.objects.get(operation=op, type="approval.reopened")
    assert reopened.data["voided"] == [bob.actor.label]
    assert reopened.data["approved_by"] == [alice.actor.label]
    assert not op.invocations.exists()
    # Another approver completes it, and it is released.
    assert _approve(carol, approval).status == "approved"
    assert isinstance(_claim(op), Lease)
    assert _state(op, approval) == ("released", "running")


@pytest.mark.django_db
def test_the_one_approver_default_is_unchanged():
    owner, alice = factories.agent(), factories.console_user("operator")
    op, approval = _gated(owner, ONE)
    assert approval.approvals_required == 1

    assert _approve(alice, approval).status == "approved"

    assert _voters(approval) == [alice.actor.label]
    assert not Event.objects.filter(operation=op, type="approval.voted").exists()
    assert isinstance(_claim(op), Lease)
    assert _state(op, approval) == ("released", "running")


def _sql(statement: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.mark.django_db
@pytest.mark.parametrize("tamper", ["vote_dropped", "count_lowered", "vote_rewritten"])
def test_votes_changed_by_sql_after_approval_are_refused_at_release(tamper):
    """The seal covers the count and the voters: a vote row dropped (with the count lowered to
    match, or not) or rewritten to another person who holds the right is an integrity failure."""
    owner = factories.agent()
    alice, bob, mallory = (factories.console_user("operator") for _ in range(3))
    op, approval = _gated(owner)
    _approve(alice, approval)
    _approve(bob, approval)
    alices = "DELETE FROM runtime_approvalvote WHERE approval_id = %s AND approver_key = %s"
    if tamper in ("vote_dropped", "count_lowered"):
        _sql(alices, [approval.pk, alice.actor.key])
    if tamper == "count_lowered":
        _sql("UPDATE runtime_approval SET approvals_required = 1 WHERE id = %s", [approval.pk])
    if tamper == "vote_rewritten":
        _sql(
            "UPDATE runtime_approvalvote SET approver = %s, approver_key = %s "
            "WHERE approval_id = %s AND approver_key = %s",
            [mallory.actor.label, mallory.actor.key, approval.pk, alice.actor.key],
        )

    refused = _claim(op)

    assert isinstance(refused, Refusal), refused
    assert _state(op, approval) == ("pending", "waiting_approval")
    assert approval.reason.startswith("integrity check failed")
    assert approval.approvals_required == 2  # the policy's count for what would run
    assert _voters(approval) == []  # decided again from the start
    assert not op.invocations.exists()


@pytest.mark.django_db
def test_a_renewed_request_is_decided_again_from_the_start():
    owner, alice = factories.agent(), factories.console_user("operator")
    admin = factories.console_user("admin")
    op, approval = _gated(owner)
    _approve(alice, approval)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now())
    approval_expire_sweep()
    assert _state(op, approval) == ("expired", "expired")

    approval_renew(admin.actor, approval.pk, expires_in_seconds=600, reason="still wanted")

    assert _state(op, approval) == ("pending", "waiting_approval")
    assert _voters(approval) == []
    assert Operation.objects.get(pk=op.pk).status == "waiting_approval"


@pytest.mark.django_db
def test_an_approval_decided_before_the_rule_releases_after_the_migration_writes_its_vote():
    """Migration 0025 writes each decided approval's one vote from its decision; its seal
    (a one-approver message, unchanged) verifies and it releases as before."""
    owner, alice = factories.agent(), factories.console_user("operator")
    op, approval = _gated(owner, ONE)
    _approve(alice, approval)
    ApprovalVote.objects.filter(approval=approval).delete()  # as the row stood before 0025

    migration = importlib.import_module("runtime.migrations.0025_two_person_approvals")
    migration.votes_from_decisions(live_apps, None)

    assert _voters(approval) == [alice.actor.label]
    assert isinstance(_claim(op), Lease)
    assert _state(op, approval) == ("released", "running")


@pytest.mark.django_db
def test_an_earlier_approver_who_lost_the_right_does_not_count_towards_the_second_approval():
    """Alice approves, then loses the operator role; Bob's approval does not make it approved
    with hers: her vote is voided (journalled) and it waits for another approver."""
    owner = factories.agent()
    alice, bob, carol = (factories.console_user("operator") for _ in range(3))
    op, approval = _gated(owner)
    _approve(alice, approval)
    alice.actor_user().groups.remove(Group.objects.get(name="operator"))

    assert _approve(bob, approval).status == "pending"

    assert _state(op, approval) == ("pending", "waiting_approval")
    assert _voters(approval) == [bob.actor.label]
    voted = Event.objects.filter(operation=op, type="approval.voted").order_by("seq").last()
    assert voted.actor == bob.actor.label and voted.data["voided"] == [alice.actor.label]
    assert (voted.data["approvals"], voted.data["approved_by"]) == (1, [bob.actor.label])
    assert _approve(carol, approval).status == "approved"
    assert isinstance(_claim(op), Lease)
