"""A client generated from /api/schema/ by openapi-python-client works as a new user would use
it: it imports, and an agent does its whole journey with it against the real server and real
workers (create a task with a budget and a required check, propose, claim, heartbeat and
complete its own work, upload an artifact and read its bytes back, wait for a signal and send
it, have a gated charge denied and another approved by an operator, complete the task), with
nothing posted by hand. Refusals come back as the typed Error. The client is generated once per
session (tests.conftest.generated_client)."""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from types import ModuleType

import pytest

from runtime.models import Artifact, Operation, Task
from tests import factories
from tests.conftest import GeneratedClient, server_start, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.workers]

PACKAGE = "console_api_client"


def _generated(made: GeneratedClient) -> Path:
    assert made.package == PACKAGE
    assert made.returncode == 0, made.stdout + made.stderr
    # Every schema construct was understood: nothing skipped, no warning.
    assert "Warning" not in made.stdout and "Skipping" not in made.stdout, made.stdout
    return made.path


class Api:
    """The generated endpoint modules, by their operation ids."""

    def __init__(self) -> None:
        self.models = importlib.import_module(f"{PACKAGE}.models")
        self.types = importlib.import_module(f"{PACKAGE}.types")

    def __getattr__(self, name: str) -> ModuleType:
        return importlib.import_module(f"{PACKAGE}.api.v1.v1_{name}")


def test_a_generated_client_does_the_whole_agent_journey(
    tmp_path, workers, monkeypatch, generated_client
):
    artifacts_root = tmp_path / "artifacts"
    server = server_start(tmp_path, ARTIFACT_ROOT=artifacts_root)
    try:
        workers.start(ARTIFACT_ROOT=artifacts_root)
        _journey(server.url, generated_client, monkeypatch)
    finally:
        server.stop()


def _journey(url: str, made: GeneratedClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_generated(made)))
    client_module = importlib.import_module(PACKAGE)
    api = Api()
    m = api.models

    agent = factories.agent()
    operator = factories.console_user("operator")
    client = client_module.AuthenticatedClient(base_url=url, token=agent.token, timeout=30)
    staff = client_module.AuthenticatedClient(base_url=url, token=operator.token, timeout=30)

    # A task with a budget and a required check on an artifact it will upload.
    task = api.tasks_create.sync(
        client=client,
        body=m.TaskIn(
            name="from a generated client",
            budget=m.TaskInBudgetType0.from_dict({"cost_cents": 100_000, "tool_calls": 20}),
            required_checks=[
                m.CheckIn(
                    name="report",
                    checker="artifact_present",
                    config=m.CheckInConfig.from_dict({"artifact": "report.txt"}),
                )
            ],
        ),
    )
    assert isinstance(task, m.Task), task
    assert task.name == "from a generated client"
    assert task.condition == m.TaskCondition.RUNNABLE

    # A worker-run tool call, read back typed.
    proposed = api.tasks_operations_create.sync_detailed(
        task_id=task.id,
        client=client,
        body=m.ToolOperationIn(
            tool="demo.echo",
            step="greet",
            params=m.ToolOperationInParams.from_dict({"text": "hello", "n": 2}),
        ),
    )
    assert proposed.status_code == 201, proposed.content
    echo = proposed.parsed
    assert isinstance(echo, m.Operation)
    read = api.operations_retrieve.sync(operation_id=echo.id, client=client)
    assert isinstance(read, m.Operation)
    assert read.id == echo.id and read.task == task.id
    assert read.params.to_dict() == {"text": "hello", "n": 2}
    assert read.kind == m.OperationKind.TOOL
    assert isinstance(read.invocations, list)

    # The agent's own work: claim, heartbeat, upload what it made, complete with its usage.
    own = api.tasks_operations_create.sync(
        task_id=task.id,
        client=client,
        body=m.ToolOperationIn(
            tool="demo.echo",
            step="write the report",
            executor=m.ExecutorEnum.AGENT,
            estimate=m.ToolOperationInEstimate.from_dict({"cost_cents": 50}),
        ),
    )
    assert isinstance(own, m.Operation), own
    lease = api.operations_claim.sync(operation_id=own.id, client=client)
    assert isinstance(lease, m.Lease), lease
    beat = api.operations_heartbeat.sync(
        operation_id=own.id,
        client=client,
        body=m.HeartbeatIn(lease_generation=lease.lease_generation, lease_token=lease.lease_token),
    )
    assert isinstance(beat, m.Heartbeat) and beat.cancel_requested is False, beat

    content = b"the report\n"
    uploaded = api.tasks_artifacts_upload.sync_detailed(
        task_id=task.id,
        client=client,
        body=m.ArtifactUploadIn(
            file=api.types.File(
                payload=io.BytesIO(content), file_name="report.txt", mime_type="text/plain"
            ),
            name="report.txt",
            media_type="text/plain",
            operation=own.id,
        ),
    )
    assert uploaded.status_code == 201, uploaded.content
    artifact = uploaded.parsed
    assert isinstance(artifact, m.Artifact)
    assert artifact.name == "report.txt" and artifact.size == len(content)
    assert artifact.operation == own.id
    stored = Artifact.objects.get(pk=artifact.id)
    assert stored.task_id == task.id and stored.digest == artifact.digest

    bytes_back = api.artifacts_content_retrieve.sync_detailed(
        artifact_id=artifact.id, client=client, inline=True
    )
    assert bytes_back.status_code == 200
    assert bytes_back.headers["content-type"].startswith("text/plain")
    assert bytes_back.headers["content-disposition"].startswith("inline")
    assert bytes_back.parsed.payload.read() == content

    done = api.operations_complete.sync(
        operation_id=own.id,
        client=client,
        body=m.CompleteIn(
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            outcome=m.CompleteInOutcomeEnum.SUCCEEDED,
            result={"pages": 1},
            usage=m.CompleteInUsage.from_dict({"cost_cents": 40}),
        ),
    )
    assert isinstance(done, m.Operation) and done.status == m.OperationStatus.SUCCEEDED, done
    budget = api.tasks_budget_retrieve.sync(task_id=task.id, client=client)
    assert isinstance(budget, m.Budget)
    assert budget.meters.to_dict()["cost_cents"]["posted"] == 40

    # A durable wait for a signal, and the signal that ends it.
    wait = api.tasks_operations_create.sync(
        task_id=task.id,
        client=client,
        body=m.WaitSignalOperationIn(
            kind=m.WaitSignalOperationInKindEnum.WAIT_SIGNAL, step="await go", signal="go"
        ),
    )
    assert isinstance(wait, m.Operation) and wait.kind == m.OperationKind.WAIT_SIGNAL, wait
    answer = api.tasks_signals_create.sync(
        task_id=task.id, client=client, body=m.SignalIn(event_id="e-1", name="go")
    )
    assert isinstance(answer, m.SignalAnswer), answer
    assert answer.disposition == m.SignalDisposition.DELIVERED

    # Two charges above the approval threshold: an operator denies one and approves the other.
    def charge(step: str, cents: int):
        op = api.tasks_operations_create.sync(
            task_id=task.id,
            client=client,
            body=m.ToolOperationIn(
                tool="demo.payments.charge",
                step=step,
                params=m.ToolOperationInParams.from_dict(
                    {"account": "acct_1", "amount_cents": cents}
                ),
            ),
        )
        assert isinstance(op, m.Operation) and op.approval is not None, op
        return op

    denied_op = charge("charge too much", 90_000)
    denied = api.approvals_decision.sync(
        approval_id=denied_op.approval.id,
        client=staff,
        body=m.DenyIn(decision=m.DenyInDecisionEnum.DENY, reason="too much"),
    )
    assert isinstance(denied, m.Approval) and denied.status == m.ApprovalStatus.DENIED, denied
    approved_op = charge("charge", 20_000)
    approved = api.approvals_decision.sync(
        approval_id=approved_op.approval.id,
        client=staff,
        body=m.ApproveIn(
            decision=m.ApproveInDecisionEnum.APPROVE, params_hash=approved_op.params_hash
        ),
    )
    assert isinstance(approved, m.Approval), approved
    assert approved.status == m.ApprovalStatus.APPROVED

    # The workers run what was released; then the task completes on its passed check.
    def settled() -> bool:
        ops = Operation.objects.filter(task_id=task.id)
        return all(o.status in ("succeeded", "failed", "cancelled") for o in ops)

    wait_for(settled, timeout=60, what="the task's operations to settle")
    now = api.tasks_retrieve.sync(task_id=task.id, client=client)
    assert isinstance(now, m.Task), now
    accepted = api.artifacts_accept_create.sync(
        artifact_id=artifact.id,
        client=client,
        body=m.AcceptIn(expected_state_version=now.state_version),
    )
    assert isinstance(accepted, m.Artifact) and accepted.status == "accepted", accepted
    finished = api.tasks_complete_create.sync(task_id=task.id, client=client)
    assert isinstance(finished, m.Task), finished
    assert finished.outcome == m.TaskOutcome.SUCCEEDED, finished
    checks = api.tasks_checks_list.sync(task_id=task.id, client=client)
    assert isinstance(checks, m.CheckList)
    assert [(c.name, c.result) for c in checks.checks] == [("report", m.ResultEnum.PASSED)]
    events = api.tasks_events_list.sync(task_id=task.id, client=client)
    assert isinstance(events, m.EventPage) and events.events
    assert Task.objects.get(pk=task.id).outcome == "succeeded"

    # A refusal is the typed Error, with the contract's code.
    missing = api.tasks_retrieve.sync(task_id="tsk_missing", client=client)
    assert isinstance(missing, m.Error)
    assert missing.error.code == "not_found"
