"""A drainer's hand-over (runtime.transitions.handover.operation_report_and_claim): the
acceptance of the call it just made and the claim of the next call in one transaction, one
commit where two did.

- Differential: each scenario runs twice, the two writers apart (operation_report, then
  operation_claim: what the drainer did before) and handed over; the rows of every task are the
  same, field by field, and where both writers take their one-statement forms the hand-over
  made one commit where apart made two.
- Lock order: two hand-overs across two tasks in opposite directions. Each writer locks in the
  global order, but two writers in one transaction would lock the first task before the
  second operation; the hand-over locks both operations and both tasks in order first, so the
  second waits for the first instead of both locking half and deadlocking.
- Recovery: a worker killed inside the hand-over leaves neither write: the call made stays
  running under its lease (the sweeper's takeover recovers it) and the next call stays due
  with its announcement (the sweeper announces it again); nothing is half-written."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime.cancellation import task_cancel
from runtime.control import task_pause
from runtime.crashpoints import crash_point_installed
from runtime.executions import execution_for_agent
from runtime.models import Operation, OutboxMessage, Task
from runtime.rules.statuses import OperationStatus as S
from runtime.transitions.accept import lease_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from runtime.transitions.handover import operation_report_and_claim
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories
from tests.concurrency import in_thread, lock_waiters
from tests.conftest import wait_for
from tests.runtime.test_differential_paths import rows_of
from tests.sqlcount import commits_counted, statements

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FORMS = ("apart", "together")


class Worker:
    """Runs calls one after another as a drainer does, through one form of the hand-over; counts
    the commits its hand-overs made."""

    def __init__(self, form: str, name: str = "") -> None:
        self.form = form
        self.execution = execution_for_agent(f"worker-{form}{name}").pk
        self.handover_commits: list[int] = []

    def claim(self, op: Operation) -> Lease | Refusal:
        return operation_claim(op.pk, execution_id=self.execution)

    def hand_over(self, lease: Lease, report: Report, nxt: Operation) -> Lease | Refusal:
        with commits_counted() as commits:
            if self.form == "together":
                _, claim = operation_report_and_claim(
                    lease, report, nxt.pk, execution_id=self.execution
                )
            else:
                try:
                    _report(lease, report, self.execution)
                except Exception as exc:
                    assert type(exc).__name__ == "StaleLease", exc
                claim = operation_claim(nxt.pk, execution_id=self.execution)
        self.handover_commits.append(commits[0])
        return claim

    def last(self, lease: Lease, report: Report) -> None:
        _report(lease, report, self.execution)


def _report(lease: Lease, report: Report, execution: str) -> Operation:
    return lease_report(lease, report, execution_id=execution)


def _ok(step: str) -> Report:
    return Report(outcome="succeeded", result={"v": step})


def _op(owner: factories.Principal, task: Task, step: str, **spec: Any) -> Operation:
    spec.setdefault("tool", "demo.slow")
    spec.setdefault("params", {"seconds": 0})
    return factories.operation(owner, task, step=step, **spec)


def _made_and_next() -> tuple[Worker, Operation, Operation, Lease]:
    """A worker holding the claim of one call (made), and the task's next call (pending)."""
    owner = factories.agent()
    task = factories.task(owner)
    made, nxt = _op(owner, task, "made"), _op(owner, task, "next")
    w = Worker("together")
    lease = w.claim(made)
    assert isinstance(lease, Lease)
    return w, made, nxt, lease


def _chain(w: Worker, ops: list[Operation], reports: list[Report]) -> list[Lease | Refusal]:
    """Claim the first call, hand each report over to the next call's claim, report the last
    alone; returns every claim."""
    claims = [w.claim(ops[0])]
    for i in range(1, len(ops)):
        made = claims[-1]
        assert isinstance(made, Lease), made
        claims.append(w.hand_over(made, reports[i - 1], ops[i]))
    if isinstance(claims[-1], Lease):
        w.last(claims[-1], reports[-1])
    return claims


# --- scenarios: each returns the tasks whose rows are compared, and whether every hand-over --
# --- took its one-statement forms (one commit) -------------------------------------------------


def scenario_one_task(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    task = factories.task(owner)
    ops = [_op(owner, task, f"s{i}") for i in range(3)]
    _chain(w, ops, [_ok(op.step) for op in ops])
    return [task], True


def scenario_across_tasks(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    first, second = factories.task(owner, name="first"), factories.task(owner, name="second")
    ops = [_op(owner, first, "a"), _op(owner, second, "b"), _op(owner, first, "c")]
    _chain(w, ops, [_ok(op.step) for op in ops])
    return [first, second], True


def scenario_transient_failure(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    """A retry is scheduled and announced (its outbox row) in the hand-over's transaction."""
    task = factories.task(owner)
    ops = [_op(owner, task, "flaky"), _op(owner, task, "next")]
    _chain(w, ops, [Report(outcome="failed", error_kind="transient", message="again"), _ok("next")])
    return [task], True


def scenario_permanent_failure(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    task = factories.task(owner)
    ops = [_op(owner, task, "bad"), _op(owner, task, "good")]
    _chain(w, ops, [Report(outcome="failed", error_kind="permanent", message="no"), _ok("good")])
    return [task], True


def scenario_unknown_outcome(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    """An effect nobody can confirm goes to a person: the general writer's, so apart."""
    task = factories.task(owner)
    ops = [
        _op(
            owner,
            task,
            "lost",
            tool="demo.payments.charge",
            params={"account": "acct_1", "amount_cents": 5},
        ),
        _op(owner, task, "next"),
    ]
    _chain(w, ops, [Report(outcome="unknown", message="the response was lost"), _ok("next")])
    return [task], False


def _next_task_stopped(
    w: Worker, owner: factories.Principal, stop: Callable[[Task], Any]
) -> tuple[list[Task], bool]:
    first, second = factories.task(owner, name="first"), factories.task(owner, name="second")
    ops = [_op(owner, first, "a"), _op(owner, second, "next")]
    stop(second)
    claims = _chain(w, ops, [_ok("a"), _ok("next")])
    assert isinstance(claims[-1], Refusal)
    return [first, second], False


def scenario_next_paused(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    """The next call's task is paused: its claim is refused (and recorded), the report is
    accepted."""
    return _next_task_stopped(w, owner, lambda t: task_pause(owner.actor, t.pk, reason="wait"))


def scenario_next_cancelled(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    """The next call's task was cancelled: the claim settles it for the stop."""
    return _next_task_stopped(w, owner, lambda t: task_cancel(owner.actor, t.pk, reason="no"))


def scenario_stopped_while_running(w: Worker, owner: factories.Principal):
    """The task of the call made was cancelled while it ran: its acceptance settles for the
    stop (the general writer), the next call is still claimed."""
    first, second = factories.task(owner, name="first"), factories.task(owner, name="second")
    ops = [_op(owner, first, "a"), _op(owner, second, "b")]
    lease = w.claim(ops[0])
    assert isinstance(lease, Lease)
    task_cancel(owner.actor, first.pk, reason="stop")
    nxt = w.hand_over(lease, _ok("a"), ops[1])
    assert isinstance(nxt, Lease)
    w.last(nxt, _ok("b"))
    return [first, second], False


def scenario_stale_report(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    """The call made lost its lease to a takeover: its report is refused (recorded), the next
    call is claimed."""
    task = factories.task(owner)
    ops = [_op(owner, task, "slow"), _op(owner, task, "next")]
    lease = w.claim(ops[0])
    assert isinstance(lease, Lease)
    Operation.objects.filter(pk=ops[0].pk).update(
        status=S.PENDING, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    Task.objects.filter(pk=task.pk).update(ops_active=1, ops_claimable=1)
    nxt = w.hand_over(lease, _ok("slow"), ops[1])
    assert isinstance(nxt, Lease)
    w.last(nxt, _ok("next"))
    return [task], False


def scenario_budgeted(w: Worker, owner: factories.Principal) -> tuple[list[Task], bool]:
    """A ledger to settle: the general writer's acceptance, so apart."""
    task = factories.task(owner, budget={"cost_cents": 1000, "tool_calls": 10})
    ops = [
        _op(owner, task, "b1", estimate={"cost_cents": 100}),
        _op(owner, task, "b2", estimate={"cost_cents": 200}),
    ]
    _chain(w, ops, [_ok("b1"), _ok("b2")])
    return [task], False


SCENARIOS: dict[str, Callable[[Worker, factories.Principal], tuple[list[Task], bool]]] = {
    name.removeprefix("scenario_"): fn
    for name, fn in globals().items()
    if name.startswith("scenario_") and callable(fn)
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_hand_over_writes_the_rows_its_two_writers_write_apart(name):
    found: dict[str, list[dict[str, Any]]] = {}
    commits: dict[str, list[int]] = {}
    covered = False
    for form in FORMS:
        owner = factories.agent(f"differential-{form}")
        worker = Worker(form)
        tasks, covered = SCENARIOS[name](worker, owner)
        found[form] = [rows_of(t) for t in tasks]
        commits[form] = worker.handover_commits
    assert found["apart"][0]["events"]
    assert found["together"] == found["apart"]
    assert all(n >= 2 for n in commits["apart"]), commits
    if covered:
        # Both writers' one-statement forms: one commit carries the acceptance and the claim.
        assert commits["together"] == [1] * len(commits["apart"]), commits


def test_hand_overs_across_two_tasks_in_opposite_directions_wait_instead_of_deadlocking():
    """Worker A accepts a call of task 1 and claims one of task 2 while worker B accepts a call
    of task 2 and claims one of task 1. Without the hand-over's first lock of both operations
    and both tasks in order, A would hold task 1 and B task 2, each then waiting for the other.
    A is stopped after its acceptance (holding everything it needs); B must be waiting for a
    lock before it writes anything, and both commit once A goes on."""
    owner = factories.agent()
    one, two = factories.task(owner, name="one"), factories.task(owner, name="two")
    a_made, b_next = _op(owner, one, "a-made"), _op(owner, one, "b-next")
    b_made, a_next = _op(owner, two, "b-made"), _op(owner, two, "a-next")
    wa, wb = Worker("together", "-a"), Worker("together", "-b")
    lease_a, lease_b = wa.claim(a_made), wb.claim(b_made)
    assert isinstance(lease_a, Lease) and isinstance(lease_b, Lease)
    with connection.cursor() as cur:
        cur.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        deadlocks = cur.fetchone()[0]

    reached: list[str] = []
    a_may_go = threading.Event()

    def at_accepted() -> None:
        name = threading.current_thread().name
        reached.append(name)
        if name == "A":
            assert a_may_go.wait(timeout=60)

    with crash_point_installed("handover.accepted", at_accepted):
        try:
            _, a_done = in_thread(lambda: wa.hand_over(lease_a, _ok("a"), a_next), "A")
            wait_for(lambda: reached == ["A"], what="A to accept its call")
            _, b_done = in_thread(lambda: wb.hand_over(lease_b, _ok("b"), b_next), "B")
            wait_for(lambda: lock_waiters() >= 1 or len(reached) > 1, what="B to wait")
            assert reached == ["A"]  # B wrote nothing: it waits for its first lock
        finally:
            a_may_go.set()
        a_claim, b_claim = a_done.result(timeout=60), b_done.result(timeout=60)
    assert reached == ["A", "B"]
    assert isinstance(a_claim, Lease) and a_claim.operation_id == a_next.pk
    assert isinstance(b_claim, Lease) and b_claim.operation_id == b_next.pk
    assert wa.handover_commits == wb.handover_commits == [1]
    with connection.cursor() as cur:
        cur.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        assert cur.fetchone()[0] == deadlocks


class Killed(BaseException):
    """A worker process dying inside the hand-over's transaction."""


def test_a_worker_killed_inside_a_hand_over_leaves_neither_write_and_both_calls_recover():
    w, made, nxt, lease = _made_and_next()

    def die() -> None:
        raise Killed

    with crash_point_installed("handover.accepted", die), pytest.raises(Killed):
        operation_report_and_claim(lease, _ok("made"), nxt.pk, execution_id=w.execution)

    made.refresh_from_db()
    nxt.refresh_from_db()
    # Neither write committed: the acceptance rolled back with the claim.
    assert made.status == S.RUNNING and made.lease_generation == lease.lease_generation
    assert nxt.status == S.PENDING and nxt.lease_generation == 0
    assert OutboxMessage.objects.filter(operation_id=nxt.pk).exists()
    # Recovery as for any killed worker: the lease lapses and is taken over; the next call's
    # announcement stays for the sweeper, and a delivery claims it.
    assert lease_expire_sweep(now=timezone.now() + timedelta(hours=1)) == 1
    made.refresh_from_db()
    assert made.status in (S.PENDING, S.RETRY_SCHEDULED)
    again = w.claim(nxt)
    assert isinstance(again, Lease)
    w.last(again, _ok("next"))
    nxt.refresh_from_db()
    assert nxt.status == S.SUCCEEDED


def test_a_hand_over_whose_claim_fails_still_accepts_the_call_made():
    """An error in the hand-over's transaction after the acceptance (the claim's half) rolls
    the acceptance back with it; the call made is then accepted on its own, and the next call
    claimed, instead of the made call's effect waiting for a lease takeover."""
    w, made, nxt, lease = _made_and_next()
    failed: list[str] = []

    def fail_once() -> None:
        if not failed:
            failed.append("claim")
            raise DatabaseError("the claim's statement failed")

    with crash_point_installed("handover.accepted", fail_once):
        accepted, claim = operation_report_and_claim(
            lease, _ok("made"), nxt.pk, execution_id=w.execution
        )
    assert failed == ["claim"]
    assert accepted is not None and accepted.status == S.SUCCEEDED
    made.refresh_from_db()
    assert made.status == S.SUCCEEDED
    assert isinstance(claim, Lease) and claim.operation_id == nxt.pk


def test_a_hand_over_is_three_statements_in_one_commit():
    """Pinned: the lock of both rows and both tasks, the acceptance's statement and the claim's
    statement (the writers' one-statement forms), one BEGIN and one COMMIT."""
    w, _, nxt, lease = _made_and_next()
    with commits_counted() as commits, CaptureQueriesContext(connection) as ctx:
        accepted, claim = operation_report_and_claim(
            lease, _ok("made"), nxt.pk, execution_id=w.execution
        )
    assert accepted is not None and accepted.status == S.SUCCEEDED
    assert isinstance(claim, Lease) and claim.operation_id == nxt.pk
    assert len(statements(ctx)) == 3, statements(ctx)
    assert commits[0] == 1
