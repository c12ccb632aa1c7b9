"""Recovery with real worker processes: a killed child, a hung worker, a restarted Redis, a
worker replaced mid-retry. Each ends with one accepted result under the newest generation."""

from __future__ import annotations

import httpx
import pytest

from runtime.errors import StaleLease
from runtime.models import Event, Execution, Invocation, Operation, RejectedObservation
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from tests import factories
from tests.conftest import server_start, wait_for

pytestmark = [pytest.mark.workers, pytest.mark.postgres]

FAST = {
    "LEASE_SECONDS": 3,
    "SWEEP_SECONDS": 1,
    "OUTBOX_GRACE_SECONDS": 2,
    "RETRY_BASE_SECONDS": 0.3,
}


def _status(op_id: str) -> str:
    return Operation.objects.get(pk=op_id).status


def test_child_killed_mid_operation_completes_once_under_a_newer_generation(workers):
    (worker,) = workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    # "hang" keeps the first invocation busy long enough to kill its process mid-operation.
    op = factories.operation(owner, task, params={"_fault": "hang", "v": 1})
    first = wait_for(
        lambda: Invocation.objects.filter(operation=op, number=1).first(),
        what="the first invocation to start",
    )
    killed = worker.kill_children()
    assert killed

    wait_for(lambda: _status(op.pk) == "succeeded", timeout=60, what="recovery to finish")
    op.refresh_from_db()
    assert op.lease_generation == 2
    assert op.result == {"v": 1}
    invocations = list(Invocation.objects.filter(operation=op).order_by("number"))
    assert [(i.number, i.lease_generation, i.outcome) for i in invocations] == [
        (1, 1, Invocation.OUTCOME_LOST),
        (2, 2, Invocation.OUTCOME_SUCCEEDED),
    ]
    # Each activation is recorded; a different one did the recovery.
    assert Execution.objects.get(pk=first.execution_id).pid in killed
    assert invocations[1].execution_id != first.execution_id
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1

    # Should the killed generation's result ever arrive, it is refused and kept for diagnosis.
    with pytest.raises(StaleLease):
        operation_report(
            op.pk,
            lease_generation=1,
            lease_token="the killed worker's token",
            state_version=2,
            report=Report(outcome="succeeded", result={"v": "late"}),
            execution_id=first.execution_id,
        )
    op.refresh_from_db()
    assert op.result == {"v": 1}
    assert RejectedObservation.objects.filter(
        operation=op, kind="stale_completion", lease_generation=1
    ).exists()


def test_hung_worker_loses_its_lease_and_its_late_result_is_rejected(workers):
    # One process, and it hangs: the sweeper must still take the lease back (it runs in a process
    # of its own, not as a task queued behind the worker it rescues), and a second worker started
    # afterwards finishes the work.
    (worker,) = workers.start(count=1, concurrency=1, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"_fault": "hang", "v": 2})

    wait_for(
        lambda: Event.objects.filter(operation=op, type="operation.lease_expired").exists(),
        timeout=60,
        what="the sweeper to take the hung worker's lease back",
    )
    workers.start(count=1, concurrency=1, **FAST)
    wait_for(lambda: _status(op.pk) == "succeeded", timeout=60, what="takeover to succeed")
    # The hung process wakes after its lease expired and tries to complete: refused, recorded.
    rejected = wait_for(
        lambda: RejectedObservation.objects.filter(operation=op, kind="stale_completion").first(),
        timeout=120,
        what=f"the hung worker's late completion:\n{worker.tail()}",
    )
    assert rejected.lease_generation == 1
    op.refresh_from_db()
    assert op.lease_generation == 2
    assert op.result == {"v": 2}
    assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    assert Event.objects.filter(operation=op, type="operation.lease_expired").count() == 1


def test_redis_stopped_and_restarted_mid_run_loses_no_operation(workers, private_redis, tmp_path):
    env = {**FAST, "REDIS_URL": private_redis.url}
    web = server_start(tmp_path, **env)
    try:
        # As deployed: supervised. (kombu's Redis client can crash the worker process while
        # the broker is away; the supervisor restarts it and the database says what is due.)
        workers.start_supervised(concurrency=2, **env)
        owner = factories.agent()
        task = factories.task(owner)
        client = httpx.Client(base_url=web.url, headers=owner.headers, timeout=30)

        def propose(i: int) -> str:
            response = client.post(
                f"/api/v1/tasks/{task.pk}/operations",
                json={"tool": "demo.echo", "params": {"i": i}, "step": f"s{i}"},
            )
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        before = [propose(i) for i in range(5)]
        wait_for(
            lambda: Operation.objects.filter(pk__in=before, status="succeeded").count() == 5,
            timeout=60,
            what="the first batch",
        )
        private_redis.stop()
        # Accepted while the broker is down: the outbox keeps the announcements.
        during = [propose(i) for i in range(5, 10)]
        assert Operation.objects.filter(pk__in=during, status="pending").count() == 5
        private_redis.start()  # empty: whatever it held is gone
        after = [propose(i) for i in range(10, 15)]
        everything = before + during + after
        wait_for(
            lambda: Operation.objects.filter(pk__in=everything, status="succeeded").count() == 15,
            timeout=120,
            what="every operation to succeed after the broker came back",
        )
        for op in Operation.objects.filter(pk__in=everything):
            assert op.result == {"i": op.params["i"]}
            assert Event.objects.filter(operation=op, type="operation.succeeded").count() == 1
    finally:
        web.stop()


def test_transient_failures_retry_with_bounded_jittered_backoff(workers):
    workers.start(count=1, concurrency=2, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"_fault": "transient:3", "v": 3})

    wait_for(lambda: _status(op.pk) == "succeeded", timeout=60, what="retries to succeed")
    op.refresh_from_db()
    assert op.attempts_used == 4
    outcomes = list(
        Invocation.objects.filter(operation=op).order_by("number").values_list("outcome", flat=True)
    )
    assert outcomes == ["failed_transient"] * 3 + ["succeeded"]
    from datetime import datetime

    retries = list(
        Event.objects.filter(operation=op, type="operation.retry_scheduled").order_by("seq")
    )
    assert len(retries) == 3
    for n, event in enumerate(retries, start=1):
        delay = (datetime.fromisoformat(event.data["retry_at"]) - event.at).total_seconds()
        assert 0 <= delay <= FAST["RETRY_BASE_SECONDS"] * 2 ** (n - 1) + 1e-6


def test_permanent_failure_is_not_retried(workers):
    workers.start(count=1, concurrency=1, **FAST)
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"_fault": "permanent"})
    wait_for(lambda: _status(op.pk) == "failed", timeout=60, what="the failure")
    op.refresh_from_db()
    assert op.attempts_used == 1
    assert op.error["kind"] == "permanent"
    assert Invocation.objects.filter(operation=op).count() == 1


def test_attempts_are_bounded_and_survive_worker_replacement(workers):
    slow = {**FAST, "RETRY_BASE_SECONDS": 4}
    (first,) = workers.start(count=1, concurrency=1, **slow)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"_fault": "transient:10"}, max_attempts=3)
    wait_for(
        lambda: (
            Operation.objects.get(pk=op.pk).attempts_used == 1
            and _status(op.pk) == "retry_scheduled"
        ),
        timeout=60,
        what="the first failure",
    )
    first.stop()
    workers.start(count=1, concurrency=1, **FAST)

    wait_for(lambda: _status(op.pk) == "failed", timeout=90, what="attempts to run out")
    op.refresh_from_db()
    # The replacement continued the count instead of starting a fresh allowance.
    assert op.attempts_used == 3
    assert "attempts exhausted" in op.error["message"]
    invocations = list(Invocation.objects.filter(operation=op).order_by("number"))
    assert [i.number for i in invocations] == [1, 2, 3]
    assert len({i.execution_id for i in invocations}) >= 2


def test_long_running_work_heartbeats_its_lease_and_is_not_taken_over(workers):
    workers.start(count=1, concurrency=2, **FAST)
    workers.start_beat(**FAST)
    owner = factories.agent()
    task = factories.task(owner)
    # Three lease periods of work: without heartbeats the sweeper would hand it over.
    op = factories.operation(owner, task, params={"_work_seconds": 9, "v": 4})
    wait_for(lambda: _status(op.pk) == "succeeded", timeout=60, what="the long work")
    op.refresh_from_db()
    assert op.lease_generation == 1
    assert op.attempts_used == 1
    assert op.result == {"v": 4}
    assert not Event.objects.filter(operation=op, type="operation.lease_expired").exists()
