"""Batches (runtime.drainers): a drainer claims quick calls together and accepts their reports
together, with the same guarantees as one operation at a time. Concurrent claimants never take
an operation twice, a taken-over lease's report is refused, a task that stops under a batch
sends its work to the one-operation path, and a proposal left to a drainer is never stranded by
the drainer's leaving."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import executor
from runtime.cancellation import task_cancel
from runtime.crashpoints import crash_point_installed
from runtime.drainers import Registration, drainable_tools, queue_of
from runtime.executions import execution_current, execution_for_agent
from runtime.models import Event, Invocation, Operation, OutboxMessage, RejectedObservation, Task
from runtime.rules.statuses import OperationStatus as S
from runtime.specs import OperationSpec
from runtime.transitions.accept_batch import operations_report_batch
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_batch import operations_claim_batch
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.lease import Lease, lease_expire_sweep
from runtime.transitions.propose import operation_propose
from runtime.worker import execute_operation
from tests import factories
from tests.concurrency import gate_at, in_thread, wait_until_blocked_on_a_lock
from tests.conftest import wait_for
from tests.sqlcount import commits_counted, statements

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

QUEUE = settings.CELERY_QUEUE
TOOLS = drainable_tools(QUEUE)


KEYS = (QUEUE, f"drainers:{QUEUE}", f"drain:{QUEUE}")


@pytest.fixture(autouse=True)
def _broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    client.delete(*KEYS, f"drain1:{QUEUE}")
    executor._quiet_until.clear()
    yield client
    client.delete(*KEYS, f"drain1:{QUEUE}")
    executor._quiet_until.clear()


@contextmanager
def _drainer_registered() -> Iterator[None]:
    """Proposals made inside go to the queue's drain list (a drainer is registered)."""
    registration = Registration(queue_of("demo.echo"))
    assert registration.renew()
    try:
        yield
    finally:
        registration.leave()


def _propose(owner: factories.Principal, task: Task, step: str, **params: object) -> Operation:
    op, _ = operation_propose(
        owner.actor,
        task.pk,
        OperationSpec(tool="demo.echo", step=step, params={"v": step, **params}),
    )
    return op


def _ok(op: Operation) -> Report:
    return Report(outcome="succeeded", result={"v": op.params["v"]})


def _journal_is_whole(task_ids: list[str]) -> None:
    """Every task's events are numbered 1..event_seq without a gap, and its counters match its
    operations."""
    for task in Task.objects.filter(pk__in=task_ids):
        seqs = sorted(Event.objects.filter(task=task).values_list("seq", flat=True))
        assert seqs == list(range(1, task.event_seq + 1)), task.pk
        statuses = Counter(Operation.objects.filter(task=task).values_list("status", flat=True))
        active = sum(n for s, n in statuses.items() if s in S.ACTIVE)
        claimable = sum(n for s, n in statuses.items() if s in S.CLAIMABLE)
        assert (task.ops_active, task.ops_claimable) == (active, claimable), task.pk


def test_a_drainer_runs_a_backlog_of_quick_calls_in_one_claim_and_one_acceptance(_broker):
    owner = factories.agent()
    tasks = [factories.task(owner, name=f"t{i}") for i in range(3)]
    with _drainer_registered():
        quick = [_propose(owner, tasks[i % 3], f"q{i}") for i in range(6)]
    slow = _propose(owner, tasks[0], "slow", _work_seconds=1)
    execution_current()  # this process's execution exists before counting

    with commits_counted() as commits, CaptureQueriesContext(connection) as ctx:
        ran = executor.queue_drain(QUEUE, asked=True)

    assert ran == 6
    # One batch: its claim and its acceptance, two statements each, whatever the batch's size.
    assert commits[0] == 2
    sent = statements(ctx)
    assert len(sent) == 4, sent
    for op in quick:
        op.refresh_from_db()
        assert (op.status, op.result, op.lease_generation) == (S.SUCCEEDED, {"v": op.step}, 1)
        assert Invocation.objects.get(operation=op).outcome == Invocation.OUTCOME_SUCCEEDED
        assert list(
            Event.objects.filter(operation=op).order_by("seq").values_list("type", flat=True)
        ) == ["operation.proposed", "operation.claimed", "operation.succeeded"]
    # The slow call, proposed with no drainer registered: still pending, announced by its own
    # message (one proposed while a drainer is registered is run alone: the test below).
    slow.refresh_from_db()
    assert slow.status == S.PENDING
    assert list(OutboxMessage.objects.values_list("operation_id", flat=True)) == [slow.pk]
    assert _broker.llen(QUEUE) == 1
    _journal_is_whole([t.pk for t in tasks])


def test_two_concurrent_batch_claims_never_take_one_operation_twice():
    owner = factories.agent()
    tasks = [factories.task(owner, name=f"t{i}") for i in range(2)]
    ids = [_propose(owner, tasks[i % 2], f"q{i}").pk for i in range(10)]

    def claim(some: list[str]) -> list[str]:
        batch = operations_claim_batch(some, TOOLS, execution_id=execution_for_agent("d").pk)
        return [lease.operation_id for lease in batch.leases]

    # The first holds six rows uncommitted while the second, given all ten, picks: it skips
    # those six, takes the other four, and then waits for the task rows the first holds.
    with gate_at("claim.batch_before_commit", "a") as gate:
        _, a = in_thread(lambda: claim(ids[:6]), "a")
        assert gate.reached.wait(30)
        _, b = in_thread(lambda: claim(ids), "b")
        wait_until_blocked_on_a_lock("the second batch to wait for the first's task rows")
        gate.release()
        first, second = a.result(timeout=60), b.result(timeout=60)

    assert sorted(first) == sorted(ids[:6])
    assert sorted(second) == sorted(ids[6:])
    assert set(Operation.objects.values_list("status", "lease_generation")) == {(S.RUNNING, 1)}
    assert Invocation.objects.count() == 10
    assert not OutboxMessage.objects.exists()
    _journal_is_whole([t.pk for t in tasks])


def test_a_single_claim_racing_a_batch_claim_takes_nothing():
    owner = factories.agent()
    task = factories.task(owner)
    op = _propose(owner, task, "q")

    def batch() -> list[str]:
        got = operations_claim_batch([op.pk], TOOLS, execution_id=execution_for_agent("d").pk)
        return [lease.operation_id for lease in got.leases]

    with gate_at("claim.batch_before_commit", "batch") as gate:
        _, batched = in_thread(batch, "batch")
        assert gate.reached.wait(30)
        _, single = in_thread(
            lambda: operation_claim(op.pk, execution_id=execution_for_agent("w").pk), "single"
        )
        wait_until_blocked_on_a_lock("the single claim to wait for the batch's row")
        gate.release()
        assert batched.result(timeout=60) == [op.pk]
        assert isinstance(single.result(timeout=60), Refusal)
    op.refresh_from_db()
    assert (op.status, op.lease_generation, op.attempts_used) == (S.RUNNING, 1, 1)
    assert Invocation.objects.filter(operation=op).count() == 1


def test_a_batch_acceptance_refuses_the_report_of_a_lease_taken_over():
    owner = factories.agent()
    task = factories.task(owner)
    ops = [_propose(owner, task, f"q{i}") for i in range(3)]
    execution = execution_for_agent("drainer").pk
    batch = operations_claim_batch([op.pk for op in ops], TOOLS, execution_id=execution)
    assert len(batch.leases) == 3
    # The first call's lease lapses and the sweeper hands the work to a new claim.
    lost = batch.leases[0]
    Operation.objects.filter(pk=lost.operation_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert lease_expire_sweep() == 1
    taken = operation_claim(lost.operation_id, execution_id=execution_for_agent("other").pk)
    assert isinstance(taken, Lease) and taken.lease_generation == 2

    outcomes = operations_report_batch(
        [(lease.operation, _ok(lease.operation)) for lease in batch.leases],
        lease_token=batch.leases[0].lease_token,
        execution_id=execution,
    )

    assert outcomes == {
        ops[0].pk: "rejected",
        ops[1].pk: "succeeded",
        ops[2].pk: "succeeded",
    }
    lost_now = Operation.objects.get(pk=lost.operation_id)
    assert (lost_now.status, lost_now.lease_generation) == (S.RUNNING, 2)
    assert RejectedObservation.objects.filter(
        operation_id=lost.operation_id, kind="stale_completion", lease_generation=1
    ).exists()
    _journal_is_whole([task.pk])


def test_a_report_with_another_batchs_token_is_refused():
    owner = factories.agent()
    task = factories.task(owner)
    op = _propose(owner, task, "q")
    execution = execution_for_agent("drainer").pk
    batch = operations_claim_batch([op.pk], TOOLS, execution_id=execution)
    outcomes = operations_report_batch(
        [(batch.leases[0].operation, _ok(op))], lease_token="forged", execution_id=execution
    )
    assert outcomes == {op.pk: "rejected"}
    op.refresh_from_db()
    assert op.status == S.RUNNING


def test_a_task_cancelled_under_a_batch_settles_through_the_one_operation_path():
    owner = factories.agent()
    task = factories.task(owner)
    other = factories.task(owner, name="other")
    ops = [_propose(owner, task, f"q{i}") for i in range(2)]
    kept = _propose(owner, other, "kept")
    execution = execution_for_agent("drainer").pk
    batch = operations_claim_batch([*(op.pk for op in ops), kept.pk], TOOLS, execution_id=execution)
    assert len(batch.leases) == 3
    task_cancel(owner.actor, task.pk, reason="stop")

    outcomes = operations_report_batch(
        [(lease.operation, _ok(lease.operation)) for lease in batch.leases],
        lease_token=batch.leases[0].lease_token,
        execution_id=execution,
    )

    assert set(outcomes.values()) == {"succeeded"}
    # The results are kept, and the task, with nothing active left, came to rest.
    assert set(Operation.objects.filter(task=task).values_list("status", flat=True)) == {
        S.SUCCEEDED
    }
    task.refresh_from_db()
    assert (task.condition, task.cancellation) == ("terminal", "quiescent")
    assert Operation.objects.get(pk=kept.pk).status == S.SUCCEEDED
    _journal_is_whole([task.pk, other.pk])
    assert {op.pk for op in ops} | {kept.pk} == set(outcomes)


def test_a_drainer_dead_after_its_claim_committed_loses_nothing_and_its_late_reports_are_refused(
    _broker,
):
    owner = factories.agent()
    task = factories.task(owner)
    with _drainer_registered():
        ops = [_propose(owner, task, f"q{i}") for i in range(3)]
    claimed: list[Lease] = []

    class Died(BaseException):
        pass

    def die() -> None:
        raise Died

    real_claim = executor.operations_claim_batch

    def keep(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        batch = real_claim(*args, **kwargs)  # type: ignore[arg-type]
        claimed.extend(batch.leases)
        return batch

    executor.operations_claim_batch = keep  # type: ignore[assignment]
    try:
        with crash_point_installed("drain.after_claim", die), pytest.raises(Died):
            executor.queue_drain(QUEUE, asked=True)
    finally:
        executor.operations_claim_batch = real_claim
    assert len(claimed) == 3
    assert set(Operation.objects.values_list("status", flat=True)) == {S.RUNNING}
    assert _broker.zcard(f"drainers:{QUEUE}") == 0  # it left the registry on its way down
    # The leases lapse; the sweeper hands the work on and a worker runs it.
    Operation.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert lease_expire_sweep() == 3
    for op in ops:
        assert executor.operation_execute(op.pk) == "succeeded"
    # The dead drainer's reports, arriving late, change nothing.
    outcomes = operations_report_batch(
        [(lease.operation, Report(outcome="succeeded", result="late")) for lease in claimed],
        lease_token=claimed[0].lease_token,
        execution_id=claimed[0].operation.execution_id or "",
    )
    assert set(outcomes.values()) == {"rejected"}
    assert all(op.result == {"v": op.step} for op in Operation.objects.all())
    _journal_is_whole([task.pk])


def test_a_proposal_goes_to_the_drain_list_while_a_drainer_is_registered(_broker):
    owner = factories.agent()
    task = factories.task(owner)
    with _drainer_registered():
        left = _propose(owner, task, "left-to-the-drainer")
        assert (_broker.llen(QUEUE), _broker.lrange(f"drain:{QUEUE}", 0, -1)) == (
            0,
            [left.pk.encode()],
        )
        # A call that is not quick goes to the list of calls run one at a time.
        alone = _propose(owner, task, "faulty", _fault="transient:1")
        assert _broker.llen(QUEUE) == 0
        assert _broker.lrange(f"drain1:{QUEUE}", 0, -1) == [alone.pk.encode()]
    _propose(owner, task, "published")
    assert (_broker.llen(QUEUE), _broker.llen(f"drain:{QUEUE}")) == (1, 1)


def test_a_worker_drains_only_a_backlog_no_drainer_has(_broker, settings):
    owner = factories.agent()
    task = factories.task(owner)
    settings.DRAIN_BACKLOG = 3
    for i in range(2):
        _propose(owner, task, f"m{i}")  # two messages wait: below the backlog
    assert executor.queue_drain(QUEUE) == 0
    assert _broker.zcard(f"drainers:{QUEUE}") == 0
    _propose(owner, task, "m2")
    with _drainer_registered():  # three wait, but another drainer has the queue
        assert executor.queue_drain(QUEUE) == 0
        settings.DRAINERS_PER_QUEUE = 2  # unless the queue may have two: then it joins
        joined: list[int] = []
        with crash_point_installed(
            "drain.leaving", lambda: joined.append(_broker.zcard(f"drainers:{QUEUE}"))
        ):
            executor.queue_drain(QUEUE)
        assert joined == [2]
        settings.DRAINERS_PER_QUEUE = 1
    # A drainer started by a call run alone (not patient) that finds no proposal leaves at once,
    # and its process leaves the queue to its messages a while (three wait, nobody drains).
    looked: list[str] = []
    with crash_point_installed("drain.leaving", lambda: looked.append("joined")):
        assert executor.queue_drain(QUEUE, patient=False) == 0  # joins, finds none, leaves
        assert executor.queue_drain(QUEUE, patient=False) == 0  # and does not join again
    assert looked == ["joined"]
    executor._quiet_until.clear()
    # Three wait and nobody drains: this worker registers, and the next proposal is its.
    registered: list[int] = []

    def propose_while_draining() -> None:
        if not registered:
            registered.append(_broker.zcard(f"drainers:{QUEUE}"))
            _, done = in_thread(lambda: _propose(owner, task, "drained"), "proposer")
            done.result(timeout=60)

    with crash_point_installed("drain.leaving", propose_while_draining):
        assert executor.queue_drain(QUEUE) == 1
    assert registered == [1]
    assert _broker.llen(QUEUE) == 3  # the proposal published no message
    assert Operation.objects.get(step="drained").status == S.SUCCEEDED


def _slow(owner: factories.Principal, task: Task, step: str) -> Operation:
    return operation_propose(
        owner.actor, task.pk, OperationSpec(tool="demo.slow", step=step, params={})
    )[0]


def test_a_burst_of_calls_that_are_not_quick_is_drained_one_at_a_time(_broker, settings):
    """Calls that are not quick under a backlog: a delivery of one makes its worker the queue's
    drainer, and the calls proposed meanwhile publish no message; the drainer runs each through
    the one-operation path (its own claim, its own lease, its own acceptance)."""
    owner = factories.agent()
    task = factories.task(owner)
    settings.DRAIN_BACKLOG = 2
    slow = [_slow(owner, task, f"s{i}") for i in range(3)]
    assert _broker.llen(QUEUE) == 3
    proposed: list[Operation] = []

    def propose_while_draining() -> None:
        if not proposed:
            _, done = in_thread(
                lambda: proposed.extend(_slow(owner, task, f"d{i}") for i in range(2)), "proposer"
            )
            done.result(timeout=60)

    with crash_point_installed("drain.leaving", propose_while_draining):
        assert execute_operation.apply(args=[slow[0].pk]).get() == "succeeded"
    assert len(proposed) == 2
    assert _broker.llen(QUEUE) == 3  # the burst's own messages: the drained calls published none
    assert _broker.llen(f"drain1:{QUEUE}") == 0
    drained = Operation.objects.filter(pk__in=[op.pk for op in proposed])
    assert {op.status for op in drained} == {S.SUCCEEDED}
    tokens = {op.lease_token_digest for op in drained}
    assert len(tokens) == 2  # claimed one at a time: a batch shares one lease token
    # The first drained call's acceptance and the second's claim share a transaction (the
    # drainer's hand-over: runtime.transitions.handover.operation_report_and_claim).
    with connection.cursor() as cur:
        cur.execute(
            "SELECT operation_id, type, xmin::text FROM runtime_event WHERE operation_id = ANY(%s)",
            [[op.pk for op in proposed]],
        )
        xid = {(op_id, kind): x for op_id, kind, x in cur.fetchall()}
    first, second = proposed
    assert xid[(first.pk, "operation.succeeded")] == xid[(second.pk, "operation.claimed")]
    assert xid[(first.pk, "operation.claimed")] != xid[(second.pk, "operation.claimed")]


def test_a_proposal_made_as_the_drainer_leaves_is_run_by_its_last_take(_broker):
    """The window the registry's order closes: the drainer found its list empty and is still
    registered, so a proposal committed now goes onto the list, not to the broker; the drainer
    leaves and then takes the list once more, and runs it."""
    owner = factories.agent()
    task = factories.task(owner)
    with _drainer_registered():
        _propose(owner, task, "first")
    late: list[Operation] = []

    def propose_in_the_window() -> None:
        if not late:
            _, done = in_thread(lambda: late.append(_propose(owner, task, "late")), "proposer")
            done.result(timeout=60)

    with crash_point_installed("drain.leaving", propose_in_the_window):
        ran = executor.queue_drain(QUEUE, asked=True)

    assert ran == 2
    assert _broker.llen(QUEUE) == 0  # the late proposal was left to the drainer
    assert Operation.objects.get(pk=late[0].pk).status == S.SUCCEEDED
    assert _broker.zcard(f"drainers:{QUEUE}") == 0


@pytest.mark.workers
def test_a_real_worker_drains_a_backlog_and_takes_new_proposals_off_the_broker(
    workers, _broker, settings, monkeypatch
):
    from runtime.transitions import fast

    owner = factories.agent()
    tasks = [factories.task(owner, name=f"t{i}") for i in range(3)]
    backlog = [_propose(owner, tasks[i % 3], f"b{i}") for i in range(30)]
    assert _broker.llen(QUEUE) == 30
    workers.start(concurrency=2, DRAIN_IDLE_SECONDS=30, DRAIN_SECONDS=60)
    wait_for(lambda: _broker.zcard(f"drainers:{QUEUE}") == 1, timeout=60, what="a drainer")

    ways: list[str | None] = []
    real = fast.announce_or_push

    def record(*args, **kwargs):  # type: ignore[no-untyped-def]
        ways.append(real(*args, **kwargs))
        return ways[-1]

    monkeypatch.setattr(fast, "announce_or_push", record)
    monkeypatch.setattr(fast, "outbox_publish", lambda messages: ways.append("celery"))
    late = [_propose(owner, tasks[i % 3], f"l{i}") for i in range(10)]

    every = [op.pk for op in backlog + late]
    wait_for(
        lambda: Operation.objects.filter(pk__in=every, status=S.SUCCEEDED).count() == 40,
        timeout=90,
        what="the backlog and the late proposals to run",
    )
    assert ways == ["drained"] * 10  # the late ones went to the drainer, not to the broker
    assert Invocation.objects.filter(operation_id__in=every).count() == 40
    _journal_is_whole([t.pk for t in tasks])


def test_a_pause_committed_while_a_batch_claim_waits_for_the_task_claims_nothing():
    """The batch picked the operations while the task was unpaused, then waited for the task
    row a pause held: once the pause commits, the batch rolls back and hands every id back."""
    from runtime.control import task_pause

    owner = factories.agent()
    task = factories.task(owner)
    ids = [_propose(owner, task, f"q{i}").pk for i in range(3)]

    with gate_at("control.applied", "pause") as gate:
        _, paused = in_thread(lambda: task_pause(owner.actor, task.pk, reason="hold"), "pause")
        assert gate.reached.wait(30)
        _, batch = in_thread(
            lambda: operations_claim_batch(ids, TOOLS, execution_id=execution_for_agent("d").pk),
            "batch",
        )
        wait_until_blocked_on_a_lock("the batch to wait for the paused task's row")
        gate.release()
        paused.result(timeout=60)
        got = batch.result(timeout=60)

    assert (got.leases, got.handed_back) == ([], ids)
    assert set(Operation.objects.values_list("status", "lease_generation")) == {(S.PENDING, 0)}
    assert not Invocation.objects.exists()
    _journal_is_whole([task.pk])


def test_a_cancel_committed_while_a_batch_acceptance_waits_settles_through_the_one_operation_path():
    """The cancel holds the task's running operations when the batch's acceptance arrives: the
    acceptance waits for them, then finds the task stopping under its lock, rolls back and
    accepts each report on the one-operation path, which lets the task come to rest."""
    owner = factories.agent()
    task = factories.task(owner)
    ids = [_propose(owner, task, f"q{i}").pk for i in range(2)]
    execution = execution_for_agent("drainer").pk
    batch = operations_claim_batch(ids, TOOLS, execution_id=execution)
    assert len(batch.leases) == 2

    with gate_at("cancel.after_lock", "cancel") as gate:
        _, cancelled = in_thread(lambda: task_cancel(owner.actor, task.pk, reason="stop"), "cancel")
        assert gate.reached.wait(30)
        _, reported = in_thread(
            lambda: operations_report_batch(
                [(lease.operation, _ok(lease.operation)) for lease in batch.leases],
                lease_token=batch.leases[0].lease_token,
                execution_id=execution,
            ),
            "report",
        )
        wait_until_blocked_on_a_lock("the acceptance to wait for the cancel's rows")
        gate.release()
        cancelled.result(timeout=60)
        outcomes = reported.result(timeout=60)

    assert outcomes == {i: "succeeded" for i in ids}
    assert set(Operation.objects.values_list("status", flat=True)) == {S.SUCCEEDED}
    task.refresh_from_db()
    assert (task.condition, task.cancellation) == ("terminal", "quiescent")
    _journal_is_whole([task.pk])


def test_a_drainer_out_of_time_or_kept_full_hands_its_queue_on(_broker, settings):
    """A session out of time leaves its list to a next turn, and a full batch asks for a
    helper: each is a ``runtime.drain_queue`` message on the queue; nothing is left behind."""
    owner = factories.agent()
    task = factories.task(owner)
    settings.DRAIN_BATCH = 2
    settings.DRAIN_SECONDS = 0
    with _drainer_registered():
        ids = [_propose(owner, task, f"q{i}").pk for i in range(5)]

    assert executor.queue_drain(QUEUE, asked=True) == 2  # one batch, then out of time
    assert _sent_tasks(_broker) == ["runtime.drain_queue"]  # the session's next turn
    assert _broker.llen(f"drain:{QUEUE}") == 3
    assert _broker.zcard(f"drainers:{QUEUE}") == 0
    _broker.delete(QUEUE)
    settings.DRAIN_SECONDS = 60
    # In time, the next turn's first batch comes back full: it asks for one helper.
    assert executor.queue_drain(QUEUE, asked=True) == 3
    assert _sent_tasks(_broker) == ["runtime.drain_queue"]
    assert set(Operation.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        S.SUCCEEDED
    }


def _sent_tasks(broker: redis.Redis) -> list[str]:
    return [json.loads(m)["headers"]["task"] for m in broker.lrange(QUEUE, 0, -1)]


def test_two_workers_that_both_saw_a_backlog_join_as_one_drainer(_broker):
    """DRAINERS_PER_QUEUE is a cap, not a hint: two worker children that both found a backlog
    and no drainer (drainer_wanted) used to both register. Joining counts and registers in one
    step on the server, so of two racing joins (threads released together at a barrier) one
    drains; a drainer asked for (a helper) joins past the cap; a lapsed entry holds no place."""
    import threading

    from runtime.drainers import Registration

    barrier = threading.Barrier(2)
    results: list[bool] = []

    def join() -> None:
        registration = Registration(QUEUE)
        barrier.wait(timeout=30)
        results.append(registration.join(1))

    threads = [threading.Thread(target=join) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False, True]
    assert _broker.zcard(f"drainers:{QUEUE}") == 1
    assert Registration(QUEUE).join(None)  # asked for: a helper
    assert _broker.zcard(f"drainers:{QUEUE}") == 2
    _broker.delete(f"drainers:{QUEUE}")
    _broker.zadd(f"drainers:{QUEUE}", {"killed:drainer": 1.0})  # lapsed long ago
    assert Registration(QUEUE).join(1)
    assert _broker.zcard(f"drainers:{QUEUE}") == 1


def test_a_drainer_asks_for_a_helper_once_a_call_waits_behind_the_one_it_runs(_broker):
    """While a drainer is registered the other workers get no message for the calls run alone:
    one waiting behind the call the drainer runs makes it ask for a helper (a
    ``runtime.drain_queue`` message); a lone call does not."""
    owner = factories.agent()
    task = factories.task(owner)
    with _drainer_registered():
        _slow(owner, task, "lone")
    assert executor.queue_drain(QUEUE, asked=True) == 1
    assert _sent_tasks(_broker) == []
    with _drainer_registered():
        for i in range(2):
            _slow(owner, task, f"pair{i}")
    assert executor.queue_drain(QUEUE, asked=True) == 2
    assert _sent_tasks(_broker) == ["runtime.drain_queue"]
