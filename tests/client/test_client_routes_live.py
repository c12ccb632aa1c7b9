"""The generated verbs against the real web server: a representative set of routes, driven the way
a user would (typed request models in, typed models out), each answer parsed into the models of
docs/openapi.yaml (every required field present, date-times and enums typed): so a body that lacks
what the schema requires (an operation's ``kind`` on a proposal's 201, say) fails here. Proposals
go by both paths: the one-statement form (a task without a budget) and the general one (with)."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest
from agent_console_client import AsyncClient, Client, RetryPolicy, errors
from agent_console_client import schema as m

from runtime.models import Operation, Task
from tests import factories

pytestmark = pytest.mark.postgres

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.2)


def _client(server, token: str) -> Client:
    return Client(base_url=server.url, token=token, retry=FAST)


@pytest.mark.parametrize("budgeted", [False, True], ids=["one-statement", "general"])
def test_proposals_and_their_work_parse_into_the_schemas_models(server, budgeted):
    agent = factories.agent()
    console = _client(server, agent.token)
    budget = {"cost_cents": 100_000, "tool_calls": 50} if budgeted else None

    task = console.tasks_create(
        m.TaskIn(
            name="generated verbs",
            budget=budget,
            external_id=f"routes-{budgeted}",
            required_checks=[
                m.CheckIn(name="report", checker="artifact_present", config={"artifact": "r.txt"})
            ],
        )
    )
    assert isinstance(task, m.Task) and task.condition is m.TaskCondition.runnable
    assert isinstance(task.created_at, datetime) and task.created_at.tzinfo is not None
    assert (task.budget is not None) == budgeted

    # A proposal's 201, then the same proposal's 200, both an Operation with its kind.
    body = m.ToolOperationIn(tool="demo.echo", step="greet", params={"text": "hi"})
    first = console.tasks_operations_create(task.id, body)
    again = console.tasks_operations_create(task.id, body)
    assert first.kind is m.OperationKind.tool and first.status is m.OperationStatus.pending
    assert again.id == first.id and again.invocations == []
    assert Operation.objects.get(pk=first.id).kind == "tool"

    wait = console.tasks_operations_create(
        task.id, m.WaitSignalOperationIn(kind="wait_signal", step="await go", signal="go")
    )
    assert wait.kind is m.OperationKind.wait_signal and wait.status is m.OperationStatus.waiting
    timer = console.tasks_operations_create(
        task.id, {"kind": "timer", "step": "later", "timeout_seconds": 3600}
    )
    assert timer.kind is m.OperationKind.timer and timer.tool is None

    answer = console.tasks_signals_create(task.id, m.SignalIn(event_id="e-1", name="go"))
    assert answer.disposition is m.SignalDisposition.delivered
    signals = console.tasks_signals_list(task.id)
    assert [s.name for s in signals.results] == ["go"]

    # The agent's own work: claim, heartbeat, an artifact, complete.
    own = console.tasks_operations_create(
        task.id,
        m.ToolOperationIn(
            tool="demo.echo", step="write", executor=m.ExecutorEnum.agent,
            estimate={"cost_cents": 10} if budgeted else None,
        ),
    )  # fmt: skip
    lease = console.operations_claim(own.id)
    assert isinstance(lease.lease_expires_at, datetime)
    beat = console.operations_heartbeat(
        own.id,
        m.HeartbeatIn(lease_generation=lease.lease_generation, lease_token=lease.lease_token),
    )
    assert beat.cancel_requested is False
    artifact = console.tasks_artifacts_upload(
        task.id, ("r.txt", b"the report\n", "text/plain"), name="r.txt", operation=own.id
    )
    assert artifact.size == 11 and artifact.operation == own.id
    assert console.artifacts_content_retrieve(artifact.id) == b"the report\n"
    assert console.artifacts_retrieve(artifact.id).digest == artifact.digest
    assert console.artifacts_provenance_retrieve(artifact.id) is not None
    assert [a.id for a in console.tasks_artifacts_list(task.id).artifacts] == [artifact.id]
    done = console.operations_complete(
        own.id,
        m.CompleteIn(
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            outcome=m.CompleteInOutcomeEnum.succeeded,
            result={"pages": 1},
            usage={"cost_cents": 7} if budgeted else None,
        ),
    )
    assert done.status is m.OperationStatus.succeeded and len(done.invocations) == 1

    # Reads of the task; the artifact accepted at the task's present version.
    now = console.tasks_retrieve(task.id)
    accepted = console.artifacts_accept_create(
        artifact.id, m.AcceptIn(expected_state_version=now.state_version)
    )
    assert accepted.status == "accepted"
    assert {o.id for o in console.tasks_operations_list(task.id).results} >= {first.id, own.id}
    assert console.operations_retrieve(own.id).result == {"pages": 1}
    meters = console.tasks_budget_retrieve(task.id).meters
    assert (meters["cost_cents"].posted == 7) if budgeted else True
    events = list(console.iter_tasks_events_list(task.id, limit=2))
    assert len(events) >= 6 and all(isinstance(e.at, datetime) for e in events)
    assert [e.id for e in events] == [e.id for e in console.tasks_events_list(task.id).events]
    checks = console.tasks_checks_run(task.id)
    assert [(c.name, c.result) for c in checks.checks] == [("report", m.ResultEnum.passed)]
    assert console.tasks_checks_list(task.id).checks[0].name == "report"
    assert "demo.echo" in {t.name for t in console.tools_list().results}

    # Control.
    paused = console.tasks_pause(task.id, body=m.ReasonIn(reason="a moment"))
    assert isinstance(paused, m.TaskCommand)
    with pytest.raises(errors.TaskPaused):
        console.tasks_operations_create(task.id, m.ToolOperationIn(tool="demo.echo", step="no"))
    console.tasks_resume(task.id)
    console.tasks_steer(task.id, m.SteerIn(direction="be brief"))
    attempt = console.tasks_attempts_create(task.id, body=m.AttemptIn(reason="again"))
    assert attempt.number == 2
    cancelled = console.tasks_cancel_create(task.id, body=m.ReasonIn(reason="enough"))
    assert cancelled.cancellation is not m.Cancellation.none
    assert Task.objects.get(pk=task.id).cancellation != "none"


def test_a_gated_charge_is_decided_through_the_generated_verbs(server):
    agent = factories.agent()
    operator = factories.console_user("operator")
    console, staff = _client(server, agent.token), _client(server, operator.token)
    task = console.tasks_create(m.TaskIn(name="charges"))

    def charge(step: str) -> m.Operation:
        op = console.tasks_operations_create(
            task.id,
            m.ToolOperationIn(
                tool="demo.payments.charge",
                step=step,
                params={"account": "acct_1", "amount_cents": 20_000},
            ),
        )
        assert op.status is m.OperationStatus.waiting_approval and op.approval is not None
        return op

    one, two, three = charge("one"), charge("two"), charge("three")
    pending = staff.approvals_list(status="pending", task=task.id).results
    assert {a.id for a in pending} == {op.approval.id for op in (one, two, three) if op.approval}
    assert one.approval and two.approval and three.approval
    assert staff.approvals_retrieve(one.approval.id).status is m.ApprovalStatus.pending

    approved = staff.approvals_decision(
        one.approval.id,
        m.ApproveIn(decision="approve", params_hash=one.params_hash),
    )
    assert approved.status is m.ApprovalStatus.approved and approved.decided_at is not None
    with pytest.raises(errors.ApprovalDecided):
        staff.approvals_decision(one.approval.id, m.DenyIn(decision="deny", reason="late"))

    edited = staff.approvals_edit(
        two.approval.id,
        m.EditIn(params={"account": "acct_1", "amount_cents": 15_000}, reason="less"),
    )
    assert edited.proposal_version == 2 and edited.status is m.ApprovalStatus.pending

    bulk = staff.approvals_decisions(
        m.BulkIn(
            decisions=[
                m.BulkItemIn(approval=three.approval.id, decision="deny", reason="no"),
                m.BulkItemIn(approval="apr_missing", decision="deny", reason="no"),
            ]
        )
    )
    assert [r.status for r in bulk.results] == [200, 404]

    effects = console.demo_receivers_effects("payments", key=one.idempotency_key)
    assert effects.receiver == "payments"


def test_list_routes_iterate_over_every_page(server):
    agent = factories.agent()
    console = _client(server, agent.token)
    made = [console.tasks_create(m.TaskIn(name=f"paged {n}")).id for n in range(5)]

    first = console.tasks_list(limit=2)
    assert len(first.results) == 2 and first.next is not None
    seen = [t.id for t in console.iter_tasks_list(limit=2)]
    assert sorted(seen) == sorted(made) and len(set(seen)) == 5

    for task_id in made[:3]:
        console.tasks_operations_create(task_id, m.ToolOperationIn(tool="demo.echo", step="s"))
    ops = list(console.iter_operations_list(limit=1))
    assert len(ops) == 3 and all(o.kind is m.OperationKind.tool for o in ops)


def test_the_async_client_has_the_same_verbs(server):
    agent = factories.agent()

    async def journey() -> tuple[list[str], str]:
        async with AsyncClient(base_url=server.url, token=agent.token, retry=FAST) as console:
            for n in range(3):
                await console.tasks_create(m.TaskIn(name=f"async {n}"))
            ids = [t.id async for t in console.iter_tasks_list(limit=2)]
            task = await console.tasks_retrieve(ids[0])
            op = await console.tasks_operations_create(
                task.id, m.ToolOperationIn(tool="demo.echo", step="s")
            )
            return ids, op.kind

    ids, kind = asyncio.run(journey())
    assert len(set(ids)) == 3 and kind is m.OperationKind.tool


def test_every_post_takes_the_callers_key(server):
    agent = factories.agent()
    console = _client(server, agent.token)

    first = console.tasks_create(m.TaskIn(name="keyed"), idempotency_key="my-key-1")
    again = console.tasks_create(m.TaskIn(name="keyed"), idempotency_key="my-key-1")
    assert again.id == first.id and Task.objects.filter(name="keyed").count() == 1
    with pytest.raises(errors.IdempotencyKeyReused):
        console.tasks_create(m.TaskIn(name="other"), idempotency_key="my-key-1")


def test_refusals_are_the_typed_errors(server):
    agent = factories.agent()
    console = _client(server, agent.token)
    with pytest.raises(errors.NotFound) as missing:
        console.tasks_retrieve("tsk_missing")
    assert missing.value.code == "not_found" and missing.value.status == 404
    with pytest.raises(errors.InvalidInput):
        console.tasks_create({"name": ""})
    with pytest.raises(errors.NotAuthenticated) as unknown:
        _client(server, "not-a-token").tools_list()
    assert unknown.value.code == "not_authenticated"
    with pytest.raises(errors.UnknownTool):
        task = console.tasks_create(m.TaskIn(name="t"))
        console.tasks_operations_create(task.id, m.ToolOperationIn(tool="no.such", step="s"))


def test_schedules_waits_and_task_endings_through_the_generated_verbs(server):
    agent = factories.agent()
    admin = factories.console_user("admin")
    console, staff = _client(server, agent.token), _client(server, admin.token)

    made = console.schedules_create(
        m.ScheduleIn(interval_seconds=3600, task=m.ScheduleTaskIn(name="hourly"), paused=True)
    )
    assert made.paused and made.interval_seconds == 3600 and made.cron is None
    assert isinstance(made.created_at, datetime)
    assert [s.id for s in console.iter_schedules_list(limit=1)] == [made.id]
    patched = console.schedules_partial_update(
        made.id, body=m.PatchedSchedulePatchIn(interval_seconds=7200, version=made.version)
    )
    assert patched.interval_seconds == 7200 and patched.version == made.version + 1
    assert console.schedules_resume(made.id).paused is False
    assert console.schedules_pause(made.id, body=m.ReasonIn(reason="quiet")).paused is True
    run = console.schedules_trigger(made.id)
    assert run.task.name == "hourly" and run.run.kind is not None
    assert console.schedules_retrieve(made.id).runs[0].task == run.task.id
    assert [t.id for t in console.iter_tasks_list(schedule=made.id)] == [run.task.id]

    # Expired waits (none here), a task failed by its agent, another completed.
    assert staff.waits_list(status="expired").results == []
    task = console.tasks_create(m.TaskIn(name="fails"))
    assert isinstance(staff.tools_declared_list(), m.DeclaredToolList)
    failed = console.tasks_fail_create(task.id, body=m.ReasonIn(reason="gave up"))
    assert isinstance(failed, m.Task)
    other = console.tasks_create(m.TaskIn(name="done"))
    finished = console.tasks_complete_create(other.id)
    assert finished.outcome is m.TaskOutcome.succeeded
