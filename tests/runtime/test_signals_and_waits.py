"""Durable waits (signal waits, timers) woken by the sweeper or a signal, never by a local sleep;
signals with their four dispositions, including the registration race on real concurrent
PostgreSQL transactions; expired waits renewed, transformed or ended by an admin only."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runtime import crashpoints
from runtime.attempts import attempt_create
from runtime.models import Event, Operation, OutboxMessage, Signal
from runtime.signals import signal_send
from runtime.sweeper import sweep_once
from runtime.waits import wait_sweep
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock
from tests.conftest import wait_for


def _wait(owner, task, name="approved-by-customer", **spec):
    return factories.operation(owner, task, kind="wait_signal", tool="", signal=name, **spec)


def _signal(who, task, event_id, name="approved-by-customer", payload=None):
    return who.client().post(
        f"/api/v1/tasks/{task.pk}/signals",
        {"event_id": event_id, "name": name, "payload": payload or {"ok": True}},
        format="json",
    )


@pytest.mark.django_db
def test_a_signal_wait_is_a_row_with_a_deadline_and_nothing_for_the_workers():
    owner = factories.agent()
    task = factories.task(owner)
    op = _wait(owner, task, timeout_seconds=120)
    assert op.status == "waiting" and op.kind == "wait_signal"
    assert op.wait_until is not None
    assert not OutboxMessage.objects.filter(operation=op).exists()
    task.refresh_from_db()
    assert task.condition == "waiting"
    response = owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"kind": "wait_signal", "step": "no-name"},
        format="json",
    )
    assert response.status_code == 400


@pytest.mark.django_db
def test_delivered_to_a_matching_wait_and_its_payload_is_the_result():
    owner = factories.agent()
    task = factories.task(owner)
    op = _wait(owner, task)
    response = _signal(owner, task, "evt-1", payload={"amount": 3})
    assert response.status_code == 202
    assert response.json()["disposition"] == "delivered"
    op.refresh_from_db()
    assert op.status == "succeeded"
    assert op.result["payload"] == {"amount": 3} and op.result["event_id"] == "evt-1"
    task.refresh_from_db()
    assert task.condition == "runnable"


@pytest.mark.django_db
def test_buffered_until_a_matching_wait_consumes_it_at_once():
    owner = factories.agent()
    task = factories.task(owner)
    assert _signal(owner, task, "evt-early").json()["disposition"] == "buffered"
    assert _signal(owner, task, "evt-other", name="other").json()["disposition"] == "buffered"
    op = _wait(owner, task)
    assert op.status == "succeeded" and op.result["event_id"] == "evt-early"
    signal = Signal.objects.get(event_id="evt-early")
    assert signal.operation_id == op.pk and signal.consumed_at is not None
    # Consumed once: a second wait of the same name waits.
    second = _wait(owner, task, step="second")
    assert second.status == "waiting"


@pytest.mark.django_db
def test_a_repeated_event_is_a_duplicate_that_names_the_original_disposition():
    owner = factories.agent()
    task = factories.task(owner)
    op = _wait(owner, task)
    assert _signal(owner, task, "evt-1").json()["disposition"] == "delivered"
    again = _signal(owner, task, "evt-1", payload={"different": True}).json()
    assert again["disposition"] == "duplicate" and again["original_disposition"] == "delivered"
    assert Signal.objects.filter(task=task, event_id="evt-1").count() == 1
    op.refresh_from_db()
    assert op.result["payload"] == {"ok": True}


@pytest.mark.django_db
def test_late_for_an_expired_wait_is_recorded_and_not_applied():
    owner = factories.agent()
    task = factories.task(owner)
    op = _wait(owner, task, timeout_seconds=60)
    Operation.objects.filter(pk=op.pk).update(wait_until=timezone.now() - timedelta(seconds=1))
    assert wait_sweep()["waits_expired"] == 1
    assert wait_sweep()["waits_expired"] == 0  # never a wake-and-retry loop
    op.refresh_from_db()
    assert op.status == "expired"
    answer = _signal(owner, task, "evt-late").json()
    assert answer["disposition"] == "late"
    op.refresh_from_db()
    assert op.status == "expired" and op.result is None
    signal = Signal.objects.get(event_id="evt-late")
    assert signal.disposition == "late" and signal.operation_id == op.pk


@pytest.mark.django_db
def test_a_task_that_does_not_exist_or_is_not_visible_is_404():
    owner, stranger = factories.agent(), factories.agent()
    task = factories.task(owner)
    missing = owner.client().post(
        "/api/v1/tasks/tsk_nope/signals", {"event_id": "e", "name": "n"}, format="json"
    )
    assert missing.status_code == 404
    assert _signal(stranger, task, "e").status_code == 404
    assert not Signal.objects.exists()


@pytest.mark.django_db
def test_a_timer_fires_from_the_sweeper_not_from_a_sleep():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, kind="timer", tool="", timeout_seconds=3600)
    assert op.status == "waiting"
    assert sweep_once()["timers_fired"] == 0
    Operation.objects.filter(pk=op.pk).update(wait_until=timezone.now())
    assert sweep_once()["timers_fired"] == 1
    op.refresh_from_db()
    assert op.status == "succeeded" and "fired_at" in op.result
    assert Event.objects.filter(task=task, type="timer.fired", actor="system:sweeper").exists()


def _run_threads(point, first, second, hold_until):
    reached, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def hold():
        if threading.current_thread().name == "first":
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
        b = threading.Thread(target=run, args=("second", second), name="second")
        b.start()
        wait_for(lambda: hold_until(b), timeout=30, what="the second side's turn")
        release.set()
        a.join(timeout=30)
        b.join(timeout=30)
    return results


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return bool(cur.fetchone()[0])


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_a_signal_between_the_waits_creation_and_its_registration_is_buffered_then_consumed():
    """The wait's row exists (uncommitted) but it has not taken the task lock yet; the signal
    commits first, finds no committed wait and is buffered; the registration then consumes it."""
    owner = factories.agent()
    task = factories.task(owner)
    results = _run_threads(
        "wait.before_register",
        lambda: _wait(owner, task),
        lambda: signal_send(
            owner.actor, task.pk, event_id="evt-race", name="approved-by-customer", payload={"n": 1}
        ),
        hold_until=lambda b: not b.is_alive(),
    )
    assert results["second"].disposition == "buffered"
    op = results["first"]
    assert isinstance(op, Operation)
    op.refresh_from_db()
    assert op.status == "succeeded" and op.result["event_id"] == "evt-race"


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_a_signal_arriving_while_the_wait_holds_the_task_lock_is_delivered():
    """The registration holds the task lock (not committed); the signal waits for it, then sees
    the committed wait and delivers to it."""
    owner = factories.agent()
    task = factories.task(owner)
    results = _run_threads(
        "wait.registered",
        lambda: _wait(owner, task),
        lambda: signal_send(
            owner.actor, task.pk, event_id="evt-race", name="approved-by-customer", payload={"n": 2}
        ),
        hold_until=lambda b: _blocked_on_a_lock(),
    )
    assert results["second"].disposition == "delivered"
    op = Operation.objects.get(pk=results["first"].pk)
    assert op.status == "succeeded" and op.result["payload"] == {"n": 2}


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
def test_two_copies_of_one_event_at_once_one_is_the_duplicate():
    owner = factories.agent()
    task = factories.task(owner)
    _wait(owner, task)
    barrier = threading.Barrier(2)
    answers = []

    def send():
        try:
            barrier.wait(timeout=10)
            answers.append(_signal(owner, task, "evt-twice").json()["disposition"])
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(answers) == ["delivered", "duplicate"]
    assert Signal.objects.filter(task=task).count() == 1


@pytest.mark.django_db
def test_only_admins_renew_transform_or_end_expired_waits():
    owner, operator, admin = (
        factories.agent(),
        factories.console_user("operator"),
        factories.console_user("admin"),
    )
    task = factories.task(owner)
    op = _wait(owner, task)
    Operation.objects.filter(pk=op.pk).update(wait_until=timezone.now())
    wait_sweep()
    listed = admin.client().get("/api/v1/waits?status=expired").json()["results"]
    assert [w["id"] for w in listed] == [op.pk]
    body = {"expires_in_seconds": 300, "reason": "customer will answer today"}
    assert (
        operator.client().post(f"/api/v1/waits/{op.pk}/renew", body, format="json").status_code
        == 403
    )
    renewed = admin.client().post(f"/api/v1/waits/{op.pk}/renew", body, format="json")
    assert renewed.status_code == 200 and renewed.json()["status"] == "waiting"
    event = Event.objects.get(task=task, type="wait.renewed")
    assert event.actor == admin.actor.label
    assert _signal(owner, task, "evt-after-renew").json()["disposition"] == "delivered"

    second = _wait(owner, task, step="again")
    Operation.objects.filter(pk=second.pk).update(wait_until=timezone.now())
    wait_sweep()
    refused = admin.client().post(f"/api/v1/waits/{op.pk}/transform", {}, format="json")
    assert refused.status_code == 409  # not expired
    transformed = admin.client().post(
        f"/api/v1/waits/{second.pk}/transform", {"reason": "give up"}, format="json"
    )
    assert transformed.status_code == 200 and transformed.json()["status"] == "cancelled"

    third = _wait(owner, task, step="third")
    Operation.objects.filter(pk=third.pk).update(wait_until=timezone.now())
    wait_sweep()
    ended = admin.client().post(f"/api/v1/waits/{third.pk}/end", {"reason": "stop"}, format="json")
    assert ended.status_code == 202
    assert ended.json()["condition"] == "terminal" and ended.json()["outcome"] == "cancelled"


@pytest.mark.workers
@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_a_short_timer_is_woken_by_its_hint_on_a_real_worker_without_the_sweeper(workers):
    workers.start(count=1, concurrency=1)  # no beat: the sweeper never runs in this test
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, kind="timer", tool="", timeout_seconds=1)
    assert op.status == "waiting"
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what="the timer's hint to wake it",
    )
    assert Event.objects.filter(task=task, type="timer.fired").count() == 1


@pytest.mark.django_db
def test_a_wait_never_outlives_its_tasks_deadline_and_a_timer_past_it_is_refused():
    from runtime.errors import TaskRefused

    owner = factories.agent()
    task = factories.task(owner, deadline_seconds=60)
    wait = _wait(owner, task, timeout_seconds=3600)
    assert wait.wait_until == task.deadline
    with pytest.raises(TaskRefused) as refused:
        factories.operation(owner, task, kind="timer", tool="", timeout_seconds=3600)
    assert refused.value.code == "deadline_exceeded"
    assert not Operation.objects.filter(task=task, kind="timer").exists()
    timer = factories.operation(owner, task, kind="timer", tool="", timeout_seconds=30)
    assert timer.wait_until < task.deadline


@pytest.mark.django_db
def test_an_expired_wait_of_an_ended_task_is_not_renewed():
    owner, admin = factories.agent(), factories.console_user("admin")
    task = factories.task(owner)
    wait = _wait(owner, task)
    Operation.objects.filter(pk=wait.pk).update(wait_until=timezone.now())
    wait_sweep()
    assert Operation.objects.get(pk=wait.pk).status == "expired"
    owner.client().post(f"/api/v1/tasks/{task.pk}/cancel", {"reason": "x"}, format="json")
    response = admin.client().post(
        f"/api/v1/waits/{wait.pk}/renew", {"expires_in_seconds": 600}, format="json"
    )
    assert response.status_code == 409, response.json()
    assert Operation.objects.get(pk=wait.pk).status == "expired"


@pytest.mark.django_db
def test_a_new_attempt_waits_anew_under_its_own_key():
    owner = factories.agent()
    task = factories.task(owner)
    first = _wait(owner, task, step="confirm")
    attempt_create(owner.actor, task.pk, reason="again")
    second = _wait(owner, task, step="confirm")
    assert second.pk != first.pk
    assert second.idempotency_key != first.idempotency_key
    assert second.attempt_id != first.attempt_id


def _wait_over_rest(owner, task, key: str | None) -> Operation:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    response = owner.client().post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"kind": "wait_signal", "step": "confirm", "signal": "approved-by-customer"},
        format="json",
        **headers,
    )
    assert response.status_code in (200, 201), response.content
    return Operation.objects.get(pk=response.json()["id"])


@pytest.mark.postgres  # real concurrent transactions: PostgreSQL row locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["service", "rest", "rest-keyed"])
@pytest.mark.parametrize("window", ["attempt-holds-the-task", "attempt-commits-after-the-read"])
def test_a_wait_racing_a_new_attempt_lands_in_it_and_a_repeat_finds_it(path, window):
    """Issue 34 N3, the proposal race fixed for tools (test_one_writer_edges, R9) for waits: the
    wait read the task's attempt 1, then attempt 2 committed before the wait took the task's
    lock, either because attempt 2 held the task row (uncommitted) while the wait's insert waited
    for it, or because attempt 2 committed whole while the wait was held just after its read.
    Before, the wait was booked in the ended attempt 1 under attempt 1's key, and the same request
    repeated created a second wait under attempt 2's. Now it lands in attempt 2 and a repeat
    (again over REST when it came that way; a keyed request proposes again in the request's own
    transaction) returns it: one wait."""
    owner = factories.agent()
    task = factories.task(owner)
    first = task.current_attempt_id

    def propose() -> Operation:
        if path == "service":
            return _wait(owner, task, step="confirm")
        return _wait_over_rest(owner, task, "wait-race" if path == "rest-keyed" else None)

    if window == "attempt-holds-the-task":
        with gate_at("attempt.before_commit", "attempt") as gate:
            starter, started = in_thread(lambda: attempt_create(owner.actor, task.pk), "attempt")
            assert gate.reached.wait(30), "the attempt never reached its commit"
            waiter, waited = in_thread(propose, "waiter")
            wait_until_blocked_on_a_lock("the wait to wait for the task row")
            gate.release()
            starter.join(30)
            waiter.join(30)
    else:
        with gate_at("wait.attempt_read", "waiter") as gate:
            waiter, waited = in_thread(propose, "waiter")
            assert gate.reached.wait(30), "the wait never read the attempt"
            starter, started = in_thread(lambda: attempt_create(owner.actor, task.pk), "attempt")
            starter.join(30)
            assert started.done(), "the new attempt waited for the wait's proposal"
            gate.release()
            waiter.join(30)

    attempt = started.result(timeout=1)
    op = waited.result(timeout=1)
    assert attempt.pk != first
    op.refresh_from_db()
    assert op.attempt_id == attempt.pk
    again = (
        _wait(owner, task, step="confirm")
        if path == "service"
        else _wait_over_rest(owner, task, None)
    )
    assert again.pk == op.pk
    assert Operation.objects.filter(task=task, kind="wait_signal").count() == 1
    assert Event.objects.filter(operation_id=op.pk, type="operation.proposed").count() == 1
