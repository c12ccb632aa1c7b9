"""Approvals bound to the exact action: the release gate, edit, bulk, expiry and renewal, and the
races (approval against its own expiry, two operators, approval against cancellation) on real
concurrent PostgreSQL transactions."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runtime import crashpoints
from runtime.approval_expiry import approval_expire_sweep
from runtime.cancellation import task_cancel
from runtime.executor import operation_execute
from runtime.models import Approval, Event, Operation, OutboxMessage
from runtime.sandbox import receivers
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock
from tests.conftest import wait_for


@pytest.fixture(autouse=True)
def _fresh_execution():
    # operation_execute registers this process's Execution once and caches its id; the previous
    # test's rollback removed that row.
    from runtime import executions

    executions._current.clear()


BIG = {"account": "acct-1", "amount_cents": 25000}


def _gated(owner, params=None, **spec):
    task = factories.task(owner)
    op = factories.operation(
        owner, task, tool="demo.payments.charge", params=dict(params or BIG), **spec
    )
    return task, op, Approval.objects.get(operation=op)


def _decide(who, approval, decision="approve", reason="looks right", params_hash=None, **extra):
    return who.client().post(
        f"/api/v1/approvals/{approval.pk}/decision",
        {
            "decision": decision,
            "reason": reason,
            "params_hash": approval.params_hash if params_hash is None else params_hash,
            **extra,
        },
        format="json",
    )


def _effects(op):
    return receivers.effects_under("payments", op.idempotency_key)


@pytest.mark.django_db
def test_a_charge_above_the_threshold_waits_for_approval_and_nothing_is_announced():
    owner = factories.agent()
    task, op, approval = _gated(owner)
    assert op.status == "waiting_approval" and op.approval_required
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert approval.status == "pending"
    assert approval.params_hash == op.params_hash and approval.proposal_version == 1
    assert approval.requested_by == owner.actor.label
    assert approval.approver_role == "operator"
    body = owner.client().get(f"/api/v1/operations/{op.pk}").json()
    assert body["approval"]["id"] == approval.pk and body["approval"]["status"] == "pending"
    task.refresh_from_db()
    assert task.condition == "waiting"
    # Below the threshold: ungated, announced at once.
    small = factories.operation(
        owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 500}
    )
    assert small.status == "pending" and not small.approval_required
    assert OutboxMessage.objects.filter(operation=small).exists()


@pytest.mark.django_db
def test_approve_releases_the_exact_action_once():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    response = _decide(operator, approval, decided_by="someone-else")
    assert response.status_code == 200, response.json()
    body = response.json()
    # The approver is the authenticated caller; a decided_by in the body is ignored.
    assert body["status"] == "approved" and body["decided_by"] == operator.actor.label
    op.refresh_from_db()
    assert op.status == "pending"
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    event = Event.objects.get(task=op.task, type="approval.approved")
    assert event.actor == operator.actor.label and event.data["approval"] == approval.pk
    # The worker's claim releases it; the charge reaches the receiver once.
    assert operation_execute(op.pk) == "succeeded"
    approval.refresh_from_db()
    assert approval.status == "released" and approval.released_at is not None
    assert len(_effects(op)) == 1


@pytest.mark.django_db
def test_deny_needs_a_reason_and_fails_the_operation_without_effect():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    missing = _decide(operator, approval, "deny", reason="")
    assert missing.status_code == 400
    response = _decide(operator, approval, "deny", reason="wrong account")
    assert response.status_code == 200 and response.json()["status"] == "denied"
    op.refresh_from_db()
    assert op.status == "failed" and op.error["kind"] == "denied"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert operation_execute(op.pk) == "nothing_to_claim"
    assert _effects(op) == []


@pytest.mark.django_db
def test_approving_without_the_parameters_hash_is_400_and_changes_nothing():
    """An approval is bound to the parameters the approver saw: an approve that names none is an
    incomplete request (400 naming the field), not a decision about another proposal."""
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    for body_hash in ("", "omitted"):
        if body_hash == "omitted":
            response = operator.client().post(
                f"/api/v1/approvals/{approval.pk}/decision",
                {"decision": "approve", "reason": "ok"},
                format="json",
            )
        else:
            response = _decide(operator, approval, params_hash=body_hash)
        assert response.status_code == 400, response.json()
        error = response.json()["error"]
        assert (error["code"], error["field"]) == ("invalid_input", "params_hash")
    approval.refresh_from_db()
    op.refresh_from_db()
    assert approval.status == "pending" and op.status == "waiting_approval"
    # A deny needs no hash: refusing is never bound to parameters.
    assert _decide(operator, approval, "deny", params_hash="").status_code == 200


@pytest.mark.django_db
def test_a_stale_hash_is_refused_and_changes_nothing():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    response = _decide(operator, approval, params_hash="sha256:" + "0" * 64)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "approval_stale"
    approval.refresh_from_db()
    op.refresh_from_db()
    assert approval.status == "pending" and op.status == "waiting_approval"


@pytest.mark.django_db
def test_an_expired_approval_cannot_be_approved_and_the_wait_stays_visible():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner, approval_timeout_seconds=60)
    assert approval.expires_at - approval.created_at == timedelta(seconds=60)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = _decide(operator, approval)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "approval_expired"
    assert approval_expire_sweep() == 1
    assert approval_expire_sweep() == 0  # never retried in a loop
    op.refresh_from_db()
    approval.refresh_from_db()
    assert approval.status == "expired" and op.status == "expired"
    assert Event.objects.filter(task=op.task, type="approval.expired").count() == 1
    assert _decide(operator, approval).json()["error"]["code"] == "approval_expired"


@pytest.mark.django_db
def test_only_an_admin_renews_an_expired_approval_and_it_is_audited():
    owner, operator, admin = (
        factories.agent(),
        factories.console_user("operator"),
        factories.console_user("admin"),
    )
    _, op, approval = _gated(owner)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now())
    approval_expire_sweep()
    body = {"expires_in_seconds": 600, "reason": "owner is back"}
    for who in (operator, owner):
        refused = who.client().post(f"/api/v1/approvals/{approval.pk}/renew", body, format="json")
        assert refused.status_code == 403
    response = admin.client().post(f"/api/v1/approvals/{approval.pk}/renew", body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "pending"
    op.refresh_from_db()
    assert op.status == "waiting_approval"
    event = Event.objects.get(task=op.task, type="approval.renewed")
    assert event.actor == admin.actor.label and event.data["reason"] == "owner is back"
    assert _decide(operator, approval).status_code == 200


@pytest.mark.django_db
def test_the_requester_and_a_role_without_the_right_cannot_approve():
    operator_as_requester = factories.console_user("operator")
    support = factories.console_user("support")
    _, _, approval = _gated(operator_as_requester)
    own = _decide(operator_as_requester, approval)
    assert own.status_code == 403 and own.json()["error"]["code"] == "not_authorized"
    assert _decide(support, approval).status_code == 403
    agent = factories.agent()
    _, _, agents_own = _gated(agent)
    assert _decide(agent, agents_own).status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"


@pytest.mark.django_db
def test_an_edit_is_a_new_proposal_that_needs_its_own_approval_not_by_the_editor():
    owner = factories.agent()
    editor, other = factories.console_user("operator"), factories.console_user("operator")
    _, op, approval = _gated(owner)
    edited = {"account": "acct-1", "amount_cents": 20000}
    response = editor.client().post(
        f"/api/v1/approvals/{approval.pk}/edit",
        {"params": edited, "reason": "cap the amount"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    new = response.json()
    assert new["proposal_version"] == 2 and new["edited_by"] == editor.actor.label
    assert new["params"] == edited and new["params_hash"] != approval.params_hash
    approval.refresh_from_db()
    assert approval.status == "denied" and approval.reason == "superseded"
    op.refresh_from_db()
    assert op.params == edited and op.params_hash == new["params_hash"]
    # The old proposal's approval does not carry over.
    assert _decide(other, approval).json()["error"]["code"] == "approval_decided"
    fresh = Approval.objects.get(pk=new["id"])
    assert _decide(editor, fresh).status_code == 403
    assert _decide(other, fresh).status_code == 200
    # The agent repeating its own proposal gets the operation back, edited, not a conflict.
    again = owner.client().post(
        f"/api/v1/tasks/{op.task_id}/operations",
        {"tool": "demo.payments.charge", "step": op.step, "params": BIG},
        format="json",
    )
    assert again.status_code == 200 and again.json()["params"] == edited
    assert operation_execute(op.pk) == "succeeded"
    assert [e["amount_cents"] for e in _effects(op)] == [20000]


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_two_operators_deciding_at_once_one_decision_stands():
    owner = factories.agent()
    first, second = factories.console_user("operator"), factories.console_user("operator")
    _, op, approval = _gated(owner)
    answers: dict[str, tuple[int, dict]] = {}

    def decide(name, who, decision):
        r = _decide(who, approval, decision, reason=f"{name} decided")
        answers[name] = (r.status_code, r.json())

    # The first decision stops while it holds the approval's locks; the second, started then,
    # must wait for them (seen in pg_stat_activity) before the first may commit: the two
    # decisions overlap for certain, and the second reads what the first decided.
    with gate_at("approval.gate_locked", "operator-a") as gate:
        a, _ = in_thread(lambda: decide("a", first, "approve"), "operator-a")
        assert gate.reached.wait(30), "the first decision never reached its locks"
        b, _ = in_thread(lambda: decide("b", second, "deny"), "operator-b")
        wait_until_blocked_on_a_lock("the second decision to wait for the first's locks")
        gate.release()
        for t in (a, b):
            t.join(timeout=30)
    codes = sorted(code for code, _ in answers.values())
    assert codes == [200, 409], answers
    loser = next(body for code, body in answers.values() if code == 409)
    assert loser["error"]["code"] == "approval_decided"
    approval.refresh_from_db()
    op.refresh_from_db()
    winner = next(body for code, body in answers.values() if code == 200)
    assert approval.status == winner["status"]
    assert op.status == ("pending" if winner["status"] == "approved" else "failed")
    assert OutboxMessage.objects.filter(operation=op).count() == (
        1 if winner["status"] == "approved" else 0
    )


def _run_holding(point: str, first, second_start, before=None):
    """Run ``first`` in a thread that stops at crash point ``point`` (inside its transaction,
    holding its row locks); start ``second`` there; let ``first`` go once ``second`` waits on a
    lock (pg_stat_activity), then collect both."""
    reached, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def hold():
        if threading.current_thread().name == "first":
            if before is not None:
                before()
            reached.set()
            release.wait(timeout=30)

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as exc:  # the test inspects what each side got
            results[name] = exc
        finally:
            connection.close()

    with crashpoints.crash_point_installed(point, hold):
        a = threading.Thread(target=run, args=("first", first), name="first")
        a.start()
        assert reached.wait(timeout=30)
        b = threading.Thread(target=run, args=("second", second_start), name="second")
        b.start()
        wait_for(_someone_waits_on_a_lock, timeout=30, what="the second side to block on a lock")
        release.set()
        a.join(timeout=30)
        b.join(timeout=30)
    return results


def _someone_waits_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return bool(cur.fetchone()[0])


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_an_approval_that_started_before_expiry_is_refused_once_the_gate_runs_after_it():
    """The decision's request starts while the approval is valid; the sweeper's expiry runs
    concurrently and waits on the operation row the gate holds; the gate's clock is read only
    after its locks, by which time the validity period is over: refused, then expired."""
    import types

    from runtime import approval_expiry, approvals

    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    expires = timezone.now() + timedelta(minutes=5)
    Approval.objects.filter(pk=approval.pk).update(expires_at=expires)
    approval.refresh_from_db()
    started = {}
    later = types.SimpleNamespace(now=lambda: expires + timedelta(seconds=1))

    def gate_waits_past_expiry():
        # Reached inside the gate after its locks: from here on the runtime's clock reads past
        # the validity period (no real waiting, so a slow machine cannot change the order).
        started.setdefault("at", timezone.now())
        approvals.timezone = later  # type: ignore[assignment]
        approval_expiry.timezone = later  # type: ignore[assignment]

    def approve():
        return _decide(operator, approval)

    def sweep():
        return approval_expire_sweep()

    try:
        results = _run_holding(
            "approval.gate_locked", approve, sweep, before=gate_waits_past_expiry
        )
    finally:
        approvals.timezone = timezone  # type: ignore[assignment]
        approval_expiry.timezone = timezone  # type: ignore[assignment]
    response = results["first"]
    assert started["at"] < expires  # the request was inside the gate before expiry
    assert response.status_code == 409, response.json()
    assert response.json()["error"]["code"] == "approval_expired"
    assert results["second"] == 1
    op.refresh_from_db()
    approval.refresh_from_db()
    assert approval.status == "expired" and op.status == "expired"
    assert not OutboxMessage.objects.filter(operation=op).exists()


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_expiry_that_holds_the_row_first_makes_the_concurrent_approval_409():
    owner, operator = factories.agent(), factories.console_user("operator")
    _, op, approval = _gated(owner)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now())
    results = _run_holding(
        "approval.expire_locked", approval_expire_sweep, lambda: _decide(operator, approval)
    )
    assert results["first"] == 1
    assert results["second"].status_code == 409
    assert results["second"].json()["error"]["code"] == "approval_expired"
    op.refresh_from_db()
    assert op.status == "expired"


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_approval_racing_cancellation_no_effect_once_the_cancel_is_accepted():
    """The approval commits first while the cancel waits for the task row; the cancel then stops
    the released work before any worker runs it: no effect at the receiver."""
    owner, operator = factories.agent(), factories.console_user("operator")
    task, op, approval = _gated(owner)
    results = _run_holding(
        "approval.before_commit",
        lambda: _decide(operator, approval),
        lambda: task_cancel(owner.actor, task.pk, "changed my mind"),
    )
    assert results["first"].status_code == 200
    op.refresh_from_db()
    assert op.status == "cancelled"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert operation_execute(op.pk) == "nothing_to_claim"
    assert _effects(op) == []


@pytest.mark.django_db(transaction=True)
def test_an_approval_after_an_accepted_cancel_is_refused():
    owner, operator = factories.agent(), factories.console_user("operator")
    task, op, approval = _gated(owner)
    task_cancel(owner.actor, task.pk, "stop")
    response = _decide(operator, approval)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "task_cancelled"
    op.refresh_from_db()
    assert op.status == "cancelled"
    assert operation_execute(op.pk) == "nothing_to_claim"
    assert _effects(op) == []
    # The request the cancel stranded is closed by the sweeper, not left pending forever.
    approval_expire_sweep()
    approval.refresh_from_db()
    assert approval.status == "denied" and "cancelled" in approval.reason


@pytest.mark.django_db
def test_a_paused_task_refuses_the_release():
    owner, operator = factories.agent(), factories.console_user("operator")
    task, _, approval = _gated(owner)
    owner.client().post(f"/api/v1/tasks/{task.pk}/pause", {}, format="json")
    response = _decide(operator, approval)
    assert response.status_code == 409 and response.json()["error"]["code"] == "task_paused"
    approval.refresh_from_db()
    assert approval.status == "pending"


@pytest.mark.django_db
def test_bulk_decisions_check_each_item_and_a_stale_one_fails_alone():
    owner, operator = factories.agent(), factories.console_user("operator")
    gated = [_gated(owner, {"account": f"acct-{i}", "amount_cents": 20000 + i}) for i in range(3)]
    (_, op0, a0), (_, op1, a1), (_, op2, a2) = gated
    response = operator.client().post(
        "/api/v1/approvals/decisions",
        {
            "decisions": [
                {
                    "approval": a0.pk,
                    "decision": "approve",
                    "reason": "",
                    "params_hash": a0.params_hash,
                },
                {"approval": a1.pk, "decision": "approve", "reason": "", "params_hash": "stale"},
                {
                    "approval": a2.pk,
                    "decision": "deny",
                    "reason": "no",
                    "params_hash": a2.params_hash,
                },
            ]
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
    results = response.json()["results"]
    assert [r["status"] for r in results] == [200, 409, 200]
    assert results[1]["error"]["code"] == "approval_stale"
    assert [Operation.objects.get(pk=o.pk).status for o in (op0, op1, op2)] == [
        "pending",
        "waiting_approval",
        "failed",
    ]
    too_many = operator.client().post(
        "/api/v1/approvals/decisions",
        {"decisions": [{"approval": a1.pk, "decision": "approve"}] * 101},
        format="json",
    )
    assert too_many.status_code == 400


@pytest.mark.django_db
def test_a_claim_without_a_covering_approval_refuses_to_run():
    owner = factories.agent()
    _, op, _ = _gated(owner)
    # As if something moved the operation to pending without a decision (never through the API).
    Operation.objects.filter(pk=op.pk).update(status="pending")
    assert operation_execute(op.pk) == "nothing_to_claim"
    op.refresh_from_db()
    assert op.status == "manual_intervention"
    assert _effects(op) == []


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_approve_and_cancel_at_once_never_leave_an_effect_after_the_cancel():
    """Both start together (a barrier, no ordering imposed): whichever wins, the operation ends
    cancelled, nothing is dispatched to the receiver, and neither side deadlocks."""
    owner, operator = factories.agent(), factories.console_user("operator")
    task, op, approval = _gated(owner)
    barrier = threading.Barrier(2)
    answers: dict[str, object] = {}

    def run(name, fn):
        try:
            barrier.wait(timeout=10)
            answers[name] = fn()
        except Exception as exc:  # the test inspects what each side got
            answers[name] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=("approve", lambda: _decide(operator, approval))),
        threading.Thread(
            target=run, args=("cancel", lambda: task_cancel(owner.actor, task.pk, "stop"))
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not isinstance(answers["cancel"], Exception), answers
    approved = answers["approve"]
    assert approved.status_code in (200, 409), approved.json()
    if approved.status_code == 409:
        assert approved.json()["error"]["code"] == "task_cancelled"
    op.refresh_from_db()
    assert op.status == "cancelled"
    assert operation_execute(op.pk) == "nothing_to_claim"
    assert _effects(op) == []


@pytest.mark.django_db
def test_an_expired_approval_of_an_ended_task_is_not_renewed():
    owner, admin = factories.agent(), factories.console_user("admin")
    task, op, approval = _gated(owner)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire_sweep() == 1
    task_cancel(owner.actor, task.pk, "stop")
    response = admin.client().post(
        f"/api/v1/approvals/{approval.pk}/renew", {"expires_in_seconds": 600}, format="json"
    )
    assert response.status_code == 409, response.json()
    assert response.json()["error"]["code"] == "task_cancelled"
    assert Operation.objects.get(pk=op.pk).status == "expired"
    assert Approval.objects.get(pk=approval.pk).status == "expired"


@pytest.mark.django_db
def test_an_approval_never_outlives_its_tasks_deadline():
    from runtime.approval_expiry import approval_renew

    owner, admin = factories.agent(), factories.console_user("admin")
    task = factories.task(owner, deadline_seconds=90)
    deadline = task.deadline
    op = factories.operation(owner, task, tool="demo.payments.charge", params=dict(BIG))
    approval = Approval.objects.get(operation=op)
    assert approval.expires_at == deadline  # the tool's default is an hour
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    approval_expire_sweep()
    renewed = approval_renew(admin.actor, approval.pk, expires_in_seconds=3600, reason="more time")
    assert renewed.expires_at == deadline


@pytest.mark.django_db
def test_the_gate_refuses_release_on_a_task_past_its_deadline_or_ended():
    from runtime.models import Task

    owner, operator = factories.agent(), factories.console_user("operator")
    late_task, late_op, late = _gated(owner)
    Task.objects.filter(pk=late_task.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    response = _decide(operator, late)
    assert response.status_code == 409, response.json()
    assert response.json()["error"]["code"] == "deadline_exceeded"
    assert Approval.objects.get(pk=late.pk).status == "pending"
    assert not OutboxMessage.objects.filter(operation=late_op).exists()

    ended_task, ended_op, ended = _gated(owner)
    Task.objects.filter(pk=ended_task.pk).update(condition="terminal", outcome="failed")
    response = _decide(operator, ended)
    assert response.status_code == 409, response.json()
    assert response.json()["error"]["code"] == "task_terminal"
    assert not OutboxMessage.objects.filter(operation=ended_op).exists()
