"""The hot path's cost is pinned: on PostgreSQL a proposal is 2 statements (the visibility read
and one INSERT ... ON CONFLICT chain), a claim 1, an acceptance 1, and an operation costs 3 write
commits end to end, the REST path with an ``Idempotency-Key`` included in the statement count's
spirit (the key's record is its own small commit). The SQL's guarded status sets come from the
transition tables; the queue and list queries can use their indexes."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import dialect, sqlfiles
from runtime.executions import execution_for_agent
from runtime.executor import operation_execute
from runtime.models import Event, Invocation, Operation, OutboxMessage
from runtime.rules.claim import CLAIM_SOURCES
from runtime.rules.statuses import OPERATION
from runtime.rules.statuses import OperationStatus as S
from runtime.specs import OperationSpec
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import claim_txn, operation_claim
from runtime.transitions.lease import Lease, lease_heartbeat
from runtime.transitions.propose import operation_propose
from tests import factories
from tests.sqlcount import commits_counted, generic_plan, statements

pytestmark = [pytest.mark.postgres]


@pytest.mark.django_db
@pytest.mark.parametrize("cancellation", ["none", "requested"])
@pytest.mark.parametrize("condition", ["running", "terminal"])
@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("deadline", [None, -1, 1])
def test_the_proposal_statement_refuses_as_the_python_rule_does(
    cancellation, condition, paused, deadline
):
    """The admission rule the proposal statement checks inside itself is rendered from the same
    table as task_admission_check: over every combination both give the same answer."""
    from django.db import DatabaseError, transaction

    from runtime.db import refusal_code
    from runtime.errors import TaskRefused
    from runtime.rules.admission import admission_refusal_sql, task_admission_check

    now = timezone.now()
    due = None if deadline is None else now + timedelta(seconds=deadline)
    try:
        task_admission_check(
            condition=condition, cancellation=cancellation, paused=paused, deadline=due, now=now
        )
        expected = None
    except TaskRefused as exc:
        expected = exc.code
    sql = (
        f"SELECT {admission_refusal_sql('t', '%s')} FROM (SELECT %s::varchar AS cancellation, "
        "%s::varchar AS condition, %s::boolean AS paused, %s::timestamptz AS deadline) t"
    )
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, [now, cancellation, condition, paused, due])
            assert cur.fetchone() == (True,)
        got = None
    except DatabaseError as exc:
        got = refusal_code(exc)
        assert got is not None, exc
    assert got == expected


def test_the_guarded_sources_in_the_sql_are_edges_of_the_table():
    assert set(CLAIM_SOURCES) <= OPERATION.sources_of(S.RUNNING)
    assert set(CLAIM_SOURCES) == set(S.CLAIMABLE)


@pytest.mark.django_db(transaction=True)
def test_propose_claim_accept_are_2_1_1_statements_and_3_commits():
    owner = factories.agent()
    task = factories.task(owner)
    execution = execution_for_agent("worker").pk
    in_transaction = []

    def seen(execute, sql, params, many, context):
        in_transaction.append(context["connection"].in_atomic_block)
        return execute(sql, params, many, context)

    with (
        commits_counted() as commits,
        CaptureQueriesContext(connection) as ctx,
        connection.execute_wrapper(seen),
    ):
        op, created = operation_propose(
            owner.actor, task.pk, OperationSpec(tool="demo.echo", step="s", params={"v": 1})
        )
    assert created
    assert len(statements(ctx)) == 2, statements(ctx)
    # No BEGIN and COMMIT of its own: the proposal statement is its own transaction.
    assert in_transaction == [False, False]
    proposed_commits = commits[0]

    with commits_counted() as commits, CaptureQueriesContext(connection) as ctx:
        lease = operation_claim(op.pk, execution_id=execution)
    assert isinstance(lease, Lease)
    assert len(statements(ctx)) == 1, statements(ctx)
    claimed_commits = commits[0]

    with commits_counted() as commits, CaptureQueriesContext(connection) as ctx:
        accepted = operation_report(
            op.pk,
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            state_version=lease.state_version,
            report=Report(outcome="succeeded", result={"v": 1}),
            execution_id=execution,
            snapshot=lease.operation,
        )
    assert len(statements(ctx)) == 1, statements(ctx)
    assert proposed_commits + claimed_commits + commits[0] == 3
    assert accepted.status == "succeeded"

    # The one-statement path wrote everything the general path writes.
    op.refresh_from_db()
    assert (op.status, op.result, op.lease_generation, op.attempts_used) == (
        "succeeded",
        {"v": 1},
        1,
        1,
    )
    assert [e.type for e in Event.objects.filter(operation=op).order_by("seq")] == [
        "operation.proposed",
        "operation.claimed",
        "operation.succeeded",
    ]
    assert all(e.actor for e in Event.objects.filter(operation=op))
    inv = Invocation.objects.get(operation=op)
    assert (inv.number, inv.lease_generation, inv.outcome) == (1, 1, "succeeded")
    assert not OutboxMessage.objects.filter(operation=op).exists()
    task.refresh_from_db()
    assert (task.ops_active, task.ops_claimable, task.ops_blocked) == (0, 0, 0)
    assert task.condition == "runnable"


@pytest.mark.django_db(transaction=True)
def test_a_retry_through_the_one_statement_acceptance_is_announced_once():
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    with CaptureQueriesContext(connection) as ctx:
        accepted = operation_report(
            op.pk,
            lease_generation=1,
            lease_token=lease.lease_token,
            state_version=lease.state_version,
            report=Report(outcome="failed", error_kind="transient", message="busy"),
            execution_id=None,
            snapshot=lease.operation,
            rng=random.Random(1),
        )
    assert len(statements(ctx)) == 1
    assert accepted.status == "retry_scheduled"
    op.refresh_from_db()
    # Later than the acceptance (not than the clock now: on a loaded host the jittered delay,
    # 0.13 s with this seed, may have passed by the time the row is read back).
    assert op.next_attempt_at is not None and op.next_attempt_at > op.updated_at
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    task.refresh_from_db()
    assert (task.ops_active, task.ops_claimable) == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_the_hot_statements_are_prepared_on_the_server_after_a_few_runs():
    owner = factories.agent()
    task = factories.task(owner)
    for i in range(7):  # past psycopg's prepare_threshold (DB_PREPARE_THRESHOLD, 5)
        op, _ = operation_propose(
            owner.actor, task.pk, OperationSpec(tool="demo.echo", step=f"s{i}", params={"i": i})
        )
        # The worker's own task body: the one-statement claim, the call, the acceptance.
        assert operation_execute(op.pk) == "succeeded"
    with connection.cursor() as cur:
        cur.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        plans = cur.fetchall()
    prepared = [row[0] for row in plans]
    # Planned once (plan_cache_mode=force_generic_plan): left to choose, PostgreSQL plans each
    # of the first five runs anew and kept doing so for these statements under load.
    assert plans and all(generic >= 1 and custom == 0 for _, generic, custom in plans), plans
    # The proposal's read and statement, the claim and the acceptance: parsed once, not per run.
    assert any("INSERT INTO runtime_operation" in sql for sql in prepared), prepared
    assert any("FROM runtime_task t" in sql and "a.number" in sql for sql in prepared)
    assert any(
        "UPDATE runtime_operation o SET" in sql and "lease_generation + 1" in sql
        for sql in prepared
    )
    assert any("result = $" in sql and "o.lease_token_digest = $" in sql for sql in prepared)


def test_preparing_can_be_turned_off_for_a_pooler_that_cannot_keep_prepared_statements(
    monkeypatch,
):
    from console.settings import _database_from_url

    url = "postgres://u@h:5432/d"
    monkeypatch.delenv("DB_PREPARE_THRESHOLD", raising=False)
    assert _database_from_url(url)["OPTIONS"]["prepare_threshold"] == 5  # type: ignore[index]
    monkeypatch.setenv("DB_PREPARE_THRESHOLD", "off")
    assert _database_from_url(url)["OPTIONS"]["prepare_threshold"] is None  # type: ignore[index]
    assert (
        _database_from_url(url + "?prepare_threshold=2")["OPTIONS"][  # type: ignore[index]
            "prepare_threshold"
        ]
        == 2
    )


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_is_one_statement():
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner))
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    with CaptureQueriesContext(connection) as ctx:
        lease_heartbeat(op.pk, 1, lease.lease_token)
    assert len(statements(ctx)) == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "queryset"),
    [
        (
            "expired leases (sweeper)",
            lambda: (
                Operation.objects.filter(status="running", lease_expires_at__lt=timezone.now())
                .order_by("lease_expires_at")
                .values_list("pk", flat=True)[:200]
            ),
        ),
        (
            "stale outbox rows (sweeper)",
            lambda: OutboxMessage.objects.filter(available_at__lte=timezone.now()).order_by(
                "available_at"
            )[:500],
        ),
        (
            "operations by status (unresolved queue, API list)",
            lambda: Operation.objects.filter(status="unresolved").order_by("created_at", "id")[:50],
        ),
        (
            "a task's operations",
            lambda: Operation.objects.filter(task_id="tsk_x").order_by("created_at")[:500],
        ),
        (
            "a task's journal after a cursor",
            lambda: Event.objects.filter(task_id="tsk_x", seq__gt=10).order_by("seq")[:200],
        ),
        (
            "an agent's tasks, newest first",
            lambda: (
                __import__("runtime.models", fromlist=["Task"])
                .Task.objects.filter(agent_id=1)
                .order_by("-created_at", "-id")[:50]
            ),
        ),
    ],
)
def test_queue_and_list_queries_can_use_an_index(name, queryset):
    """With sequential scans priced out, the planner must find an index for each hot query: a
    query that could only be answered by scanning the table fails here."""
    sql, params = queryset().query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "Index" in plan and "Seq Scan" not in plan, f"{name}:\n{plan}"


def _finished_operations(count: int) -> None:
    """``count`` succeeded operations, each with its invocation (copies of one that ran), then
    fresh statistics: a queue analysed while it held no work, as autovacuum finds it between
    bursts."""
    owner = factories.agent()
    template = factories.operation(owner, factories.task(owner))
    assert operation_execute(template.pk) == "succeeded"

    def copy(model: Any, table: str, values: dict[str, str], where: str) -> None:
        # Every column of the template row, with ``values`` in place; a primary key not given
        # is left to the table's default (the invocation's identity).
        fields = model._meta.concrete_fields
        columns = [f.column for f in fields if f.column in values or not f.primary_key]
        select = ", ".join(values.get(c, f'"{c}"') for c in columns)
        with connection.cursor() as cur:
            cur.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} "
                f"FROM {table}, generate_series(1, %s) g WHERE {where} = %s",
                [count, template.pk],
            )

    fresh = {"id": "'op_fin' || g", "idempotency_key": "'fin-' || g"}
    copy(Operation, "runtime_operation", fresh, "id")
    copy(Invocation, "runtime_invocation", {"operation_id": "'op_fin' || g"}, "operation_id")
    with connection.cursor() as cur:
        cur.execute("ANALYZE runtime_operation, runtime_invocation, runtime_task")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name",
    [
        "claim_one",
        "accept_one",
        "claim_batch_pick",
        "claim_batch_journal",
        "accept_batch_pick",
        "accept_batch_journal",
    ],
)
def test_statements_given_their_operations_ids_find_them_by_id_whatever_the_statistics(name):
    """A queue's statistics are often taken while it holds no work. The planner then believes
    that few rows are pending or running and, in a prepared statement's generic plan, would
    rather read a status index (every pending row, for every batch claim: a burst's cost grows
    with its square) than look the given ids up. Each statement that is handed its operations'
    ids must find them, and their invocations, through the keys, never a status index or a
    scan of the table."""
    _finished_operations(3000)
    plan = generic_plan(sqlfiles.RENDERED[name])
    for status_index in ("op_live", "op_waiting_until", "op_expired"):
        assert status_index not in plan, plan
    assert "op_compensates_set" not in plan and "compensates_id_" not in plan, plan
    # (The task table of this test has two rows: a scan of it is the right plan.)
    assert "Seq Scan on runtime_operation" not in plan, plan
    assert "Seq Scan on runtime_invocation" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_a_proposal_over_rest_with_an_idempotency_key_is_one_commit():
    """The key's record is written in the proposal's own transaction: the REST path keeps the
    operation at 3 write commits (propose, claim, accept)."""
    owner = factories.agent()
    task = factories.task(owner)
    client = owner.client()
    body = {"tool": "demo.echo", "step": "s", "params": {"v": 1}}
    # A token's first use records its last use (then at most once a minute): not the hot path.
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 200
    with commits_counted() as commits, CaptureQueriesContext(connection) as ctx:
        response = client.post(
            f"/api/v1/tasks/{task.pk}/operations", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
        )
    assert response.status_code == 201, response.content
    assert commits[0] == 1
    # The token, the key's claim (its lock and its record's read: one function call), the task,
    # the proposal, the key's record.
    sent = statements(ctx)
    assert len(sent) == 5, sent
    assert "runtime_idempotency_claim" in sent[1], sent
    # Directly in the request's transaction the proposal needs no savepoint (a refusal ends
    # the request): two round trips fewer.
    sent = [q["sql"] for q in ctx.captured_queries]
    assert not [q for q in sent if q.startswith(("SAVEPOINT", "RELEASE"))], sent
    replay = client.post(
        f"/api/v1/tasks/{task.pk}/operations", body, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == response.json()


# --- the ledger on the hot path --------------------------------------------------------------
# The one-statement proposal and acceptance carry no ledger: for a task with a budget they
# decline to the general path (guarded meter UPDATEs in the same transaction), and the claim
# statement declines a budgeted re-dispatch (which may have to hold again). With the hot path
# on, each of these would pass the ledger by without the decline.


def _meter(task_id: str, name: str = "cost_cents") -> tuple[int, int, int]:
    from runtime.models import BudgetMeter

    m = BudgetMeter.objects.get(task_id=task_id, meter=name)
    return m.reserved, m.posted, m.unknown


@pytest.mark.django_db(transaction=True)
def test_with_the_hot_path_on_a_budgeted_proposal_holds_and_a_refusal_writes_nothing(settings):
    from runtime.errors import BudgetExhausted
    from runtime.models import BudgetHold

    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 100})  # 90 for ordinary work
    op, created = operation_propose(
        owner.actor,
        task.pk,
        OperationSpec(tool="demo.echo", step="a", params={}, estimate={"cost_cents": 60}),
    )
    assert created
    assert _meter(task.pk) == (60, 0, 0)
    assert BudgetHold.objects.filter(operation=op, status="held").count() == 1
    events = Event.objects.filter(task=task).count()
    with pytest.raises(BudgetExhausted):
        operation_propose(
            owner.actor,
            task.pk,
            OperationSpec(tool="demo.echo", step="b", params={}, estimate={"cost_cents": 31}),
        )
    assert _meter(task.pk) == (60, 0, 0)
    assert Operation.objects.filter(task=task).count() == 1
    assert Event.objects.filter(task=task).count() == events
    assert OutboxMessage.objects.filter(operation__task=task).count() == 1
    task.refresh_from_db()
    assert (task.ops_active, task.ops_claimable) == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_with_the_hot_path_on_concurrent_budgeted_proposals_never_over_admit(settings):
    """Six threads (own connections) released together by a barrier each propose 30 against
    the 90 ordinary work may hold: exactly three are admitted."""
    import threading

    from runtime.errors import BudgetExhausted
    from tests.concurrency import in_thread

    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 100})
    barrier = threading.Barrier(6, timeout=60)

    def propose(n: int):
        def run() -> str:
            barrier.wait()
            try:
                operation_propose(
                    owner.actor,
                    task.pk,
                    OperationSpec(
                        tool="demo.echo", step=f"s{n}", params={}, estimate={"cost_cents": 30}
                    ),
                )
            except BudgetExhausted:
                return "refused"
            return "admitted"

        return run

    racers = [in_thread(propose(n), name=f"racer-{n}") for n in range(6)]
    results = [future.result(timeout=120) for _, future in racers]
    assert sorted(results) == ["admitted"] * 3 + ["refused"] * 3
    assert _meter(task.pk) == (90, 0, 0)
    assert Operation.objects.filter(task=task).count() == 3


@pytest.mark.django_db(transaction=True)
def test_with_the_hot_path_on_acceptance_settles_usage_and_releases_the_rest(settings):
    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 100, "tool_calls": 5})
    op = factories.operation(owner, task, estimate={"cost_cents": 50})
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    accepted = operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="succeeded", result={}, usage={"cost_cents": 12}),
        execution_id=None,
        snapshot=lease.operation,
    )
    assert accepted.status == "succeeded"
    assert _meter(task.pk) == (0, 12, 0)
    assert _meter(task.pk, "tool_calls") == (0, 1, 0)


@pytest.mark.django_db(transaction=True)
def test_with_the_hot_path_on_a_redispatch_after_a_lost_call_holds_again(settings):
    from datetime import timedelta

    from runtime.transitions.lease import lease_expire_sweep

    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 100})
    op = factories.operation(owner, task, estimate={"cost_cents": 40})
    first = operation_claim(op.pk, execution_id=execution_for_agent("w1").pk)
    assert isinstance(first, Lease)
    assert lease_expire_sweep(now=timezone.now() + timedelta(hours=1)) == 1
    assert _meter(task.pk) == (0, 0, 40)  # the lost call's hold is unknown, never free
    second = operation_claim(op.pk, execution_id=execution_for_agent("w2").pk)
    assert isinstance(second, Lease)
    assert _meter(task.pk) == (40, 0, 40)


# --- humans in the loop on the hot path ------------------------------------------------------
# The one-statement proposal and claim must carry every check the general path makes, or decline
# to it: a gated proposal is created ``waiting_approval`` with nothing announced, and the claim
# statement never takes work that waits for an approval or belongs to a paused task.

BIG_CHARGE = {"account": "acct-hot", "amount_cents": 25000}


def _claim_statement(op: Operation, execution: str) -> Operation | None:
    """The hot path's claim statement alone, in its own transaction (what operation_claim tries
    first)."""
    from django.db import transaction

    with transaction.atomic():
        return _claim_statement_txn(op, execution)


def _claim_statement_txn(op: Operation, execution: str) -> Operation | None:
    """The claim statement inside the caller's transaction."""
    return claim_txn(
        op.pk,
        execution_id=execution,
        executor=op.executor,
        lease_seconds=30,
        token_digest="digest",
        supported=[f"{op.tool}:{op.tool_version}"],
        actor=f"execution:{execution}",
        now=timezone.now(),
    )


@pytest.mark.django_db(transaction=True)
def test_a_proposal_that_needs_approval_is_waiting_approval_with_nothing_announced(settings):
    settings.HOTPATH = True
    assert dialect.one_statement_forms()
    owner = factories.agent()
    task = factories.task(owner)
    op, created = operation_propose(
        owner.actor,
        task.pk,
        OperationSpec(tool="demo.payments.charge", step="pay", params=BIG_CHARGE),
    )
    assert created
    op.refresh_from_db()
    assert (op.status, op.approval_required) == (S.WAITING_APPROVAL, True)
    assert op.approvals.get().status == "pending"
    assert not OutboxMessage.objects.filter(operation=op).exists()
    proposed = Event.objects.get(operation=op, type="operation.proposed")
    assert proposed.data["status"] == S.WAITING_APPROVAL
    assert Event.objects.filter(operation=op, type="approval.requested").count() == 1
    task.refresh_from_db()
    assert (task.ops_claimable, task.ops_blocked, task.condition) == (0, 1, "waiting")
    # The same proposal again (an agent's retry) returns it, still gated, still unannounced.
    again, created = operation_propose(
        owner.actor,
        task.pk,
        OperationSpec(tool="demo.payments.charge", step="pay", params=BIG_CHARGE),
    )
    assert (again.pk, created) == (op.pk, False)
    assert not OutboxMessage.objects.filter(operation=op).exists()


@pytest.mark.django_db(transaction=True)
def test_the_claim_statement_never_takes_work_that_waits_for_an_approval(settings):
    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(
        owner, task, step="pay", tool="demo.payments.charge", params=BIG_CHARGE
    )
    # As if the operation had become claimable with no decision (never through the API).
    Operation.objects.filter(pk=op.pk).update(status=S.PENDING)
    execution = execution_for_agent("w").pk
    assert _claim_statement(op, execution) is None  # the statement declines, writing nothing
    op.refresh_from_db()
    assert (op.status, op.lease_generation, op.attempts_used) == (S.PENDING, 0, 0)
    # The general path it declines to refuses to run it without an approval of these parameters.
    refused = operation_claim(op.pk, execution_id=execution)
    assert not isinstance(refused, Lease)
    op.refresh_from_db()
    assert op.status == S.MANUAL_INTERVENTION
    assert not Invocation.objects.filter(operation=op).exists()


@pytest.mark.django_db(transaction=True)
def test_approved_work_is_claimed_once_and_its_approval_released(settings):
    from runtime.approvals import approval_decide

    settings.HOTPATH = True
    owner, operator = factories.agent(), factories.console_user("operator")
    task = factories.task(owner)
    op = factories.operation(
        owner, task, step="pay", tool="demo.payments.charge", params=BIG_CHARGE
    )
    approval = op.approvals.get()
    approval_decide(
        operator.actor, approval.pk, decision="approve", reason="", params_hash=op.params_hash
    )
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    lease = operation_claim(op.pk, execution_id=execution_for_agent("w").pk)
    assert isinstance(lease, Lease)
    approval.refresh_from_db()
    assert approval.status == "released" and approval.released_at is not None
    assert not OutboxMessage.objects.filter(operation=op).exists()
    assert Invocation.objects.filter(operation=op).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_claim_statement_never_takes_work_of_a_paused_task(settings):
    from runtime.control import task_pause, task_resume

    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, params={"v": 1})
    task_pause(owner.actor, task.pk)
    execution = execution_for_agent("w").pk
    assert _claim_statement(op, execution) is None
    op.refresh_from_db()
    assert (op.status, op.lease_generation) == (S.PENDING, 0)
    refused = operation_claim(op.pk, execution_id=execution)
    assert not isinstance(refused, Lease) and refused.reason == "the task is paused"
    # The delivery spent its announcement; resume announces the work again and it runs once.
    assert not OutboxMessage.objects.filter(operation=op).exists()
    task_resume(owner.actor, task.pk)
    assert OutboxMessage.objects.filter(operation=op).count() == 1
    lease = operation_claim(op.pk, execution_id=execution)
    assert isinstance(lease, Lease) and lease.lease_generation == 1
    assert Invocation.objects.filter(operation=op).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_claim_statement_locks_only_what_it_takes_and_no_stronger_than_its_update():
    """The claim reads the status it leaves under the row's lock (the journal's "from"). That
    read locks nothing of a row it cannot take (a duplicate delivery of running work: a batch
    claimer's SKIP LOCKED must not skip the row for it, nor wait), and locks a row it takes with
    the UPDATE's own strength (FOR NO KEY UPDATE), so another transaction inserting an event or
    an invocation for the operation (a key-share lock) is not made to wait. Checked from a
    second connection while the claiming transaction is held open in its own thread."""
    import threading

    from django.db import transaction

    from tests.concurrency import in_thread

    alice = factories.agent()
    task = factories.task(alice)
    running = factories.operation(alice, task)
    worker = execution_for_agent("w").pk
    assert isinstance(operation_claim(running.pk, execution_id=worker), Lease)
    pending = factories.operation(alice, task)
    inside, release = threading.Event(), threading.Event()
    claimed: dict[str, Any] = {}

    def claim_and_hold() -> None:
        with transaction.atomic():
            claimed["running"] = _claim_statement_txn(running, worker)
            claimed["pending"] = _claim_statement_txn(pending, worker)
            inside.set()
            assert release.wait(timeout=30)

    thread, future = in_thread(claim_and_hold)
    try:
        assert inside.wait(timeout=30)
        assert claimed["running"] is None and claimed["pending"] is not None
        with connection.cursor() as cur:
            cur.execute(
                "SELECT id FROM runtime_operation WHERE id = %s FOR UPDATE SKIP LOCKED",
                [running.pk],
            )
            assert cur.fetchall() == [(running.pk,)]  # the refused claim locked nothing
            cur.execute(
                "SELECT id FROM runtime_operation WHERE id = %s FOR KEY SHARE NOWAIT",
                [pending.pk],
            )
            assert cur.fetchall() == [(pending.pk,)]  # taken, yet a foreign key check passes
    finally:
        release.set()
        future.result(timeout=30)
        thread.join()


# Columns the hot path's updates change without a status change (issue 37): the task's row at
# every proposal, claim and acceptance (its journal sequence, counters, condition), the
# operation's at every heartbeat (its lease). An index that names one of them, as a key, an
# included column or in its predicate, makes every such update non-HOT: a new entry in each of
# the table's indexes.
HOT_COLUMNS = {
    "runtime_task": (
        "condition",
        "event_seq",
        "ops_active",
        "ops_claimable",
        "ops_blocked",
        "state_version",
        "updated_at",
    ),
    "runtime_operation": ("lease_expires_at", "updated_at"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("table", sorted(HOT_COLUMNS))
def test_no_index_names_a_column_the_hot_path_updates_in_place(table):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass",
            [table],
        )
        definitions = [row[0] for row in cur.fetchall()]
        cur.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [table])
        options = cur.fetchone()[0] or []
    for definition in definitions:
        for column in HOT_COLUMNS[table]:
            assert f"({column}" not in definition and f" {column}" not in definition, definition
    assert "fillfactor=90" in options  # room in each page for the new version
