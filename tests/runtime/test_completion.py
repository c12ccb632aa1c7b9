"""Completion and its checks: success only when every required check passed on the artifacts
accepted now and nothing covered is live; failed, unavailable and timed-out checks keep the task
unfinished with the reason; a check on a replaced artifact no longer counts; results record the
checker and its version, the subject's digest and the task version."""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.db import transaction
from django.utils import timezone

from runtime import checkers, checks, completion
from runtime.artifact_reconciliation import reconcile_due
from runtime.artifacts import UploadSpec, artifact_accept, artifact_upload
from runtime.crashpoints import crash_point_installed
from runtime.errors import CompletionRefused, InvalidInput, TaskRefused, UnknownChecker
from runtime.models import CheckResult, Task
from runtime.selectors.artifacts import artifact_content, artifact_get, verification_of
from runtime.transitions.status import operation_transition_txn
from tests import factories
from tests.conftest import wait_for

SCHEMA = {
    "type": "object",
    "required": ["summary"],
    "properties": {"summary": {"type": "string"}},
}
REPORT_CHECKS = [
    {"name": "has report", "checker": "artifact_present", "config": {"artifact": "report.json"}},
    {
        "name": "report shape",
        "checker": "json_schema",
        "config": {"artifact": "report.json", "schema": SCHEMA},
    },
]


def accept_json(owner, task, document, name: str = "report.json"):
    data = json.dumps(document).encode()
    made = artifact_upload(
        owner.actor,
        task.pk,
        UploadSpec(name=name, media_type="application/json"),
        io.BytesIO(data),
    )
    current = Task.objects.get(pk=task.pk).state_version
    return artifact_accept(owner.actor, made.pk, expected_state_version=current)


def refusal_of(owner, task, **kwargs) -> CompletionRefused:
    with pytest.raises(CompletionRefused) as refused:
        completion.task_complete(owner.actor, task.pk, **kwargs)
    return refused.value


@pytest.mark.django_db(transaction=True)
def test_a_task_without_required_checks_completes_on_the_agents_word():
    alice = factories.agent()
    task = factories.task(alice)
    done = completion.task_complete(alice.actor, task.pk)
    assert (done.condition, done.outcome) == ("terminal", "succeeded")
    assert task.events.filter(type="task.succeeded", actor=alice.actor.label).exists()
    # Asking again is harmless.
    assert completion.task_complete(alice.actor, task.pk).outcome == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_completion_refused_with_the_reasons_then_accepted(fs_artifacts):
    alice = factories.agent()
    task = factories.task(alice, required_checks=REPORT_CHECKS)
    refused = refusal_of(alice, task)
    assert refused.code == "completion_refused"
    reasons = {c["name"]: c for c in refused.details["checks"]}
    assert set(reasons) == {"has report", "report shape"}
    assert reasons["has report"]["result"] == "failed"
    assert "no accepted artifact named 'report.json'" in reasons["has report"]["reason"]
    assert Task.objects.get(pk=task.pk).outcome is None
    assert task.events.filter(type="task.completion_refused").exists()

    accept_json(alice, task, {"no summary": True})
    refused = refusal_of(alice, task)
    assert [c["name"] for c in refused.details["checks"]] == ["report shape"]
    assert "'summary' is a required property" in refused.details["checks"][0]["reason"]

    report = accept_json(alice, task, {"summary": "all good"})
    done = completion.task_complete(alice.actor, task.pk)
    assert done.outcome == "succeeded"
    standing = {s.name: s for s in checks.check_states(task.pk)}
    for name in ("has report", "report shape"):
        row = standing[name].latest
        assert row is not None and row.result == "passed" and standing[name].counts
        assert row.subject_id == report.pk and row.subject_digest == report.digest
        assert row.checker_version == "1"
        assert row.task_state_version == report.accepted_state_version


@pytest.mark.django_db(transaction=True)
def test_a_check_on_a_replaced_artifact_no_longer_counts(fs_artifacts):
    alice = factories.agent()
    task = factories.task(alice, required_checks=REPORT_CHECKS[1:])
    first = accept_json(alice, task, {"summary": "v1"})
    [state] = checks.task_checks_run(alice.actor, task.pk)
    assert state.counts and state.latest.subject_id == first.pk
    second = accept_json(alice, task, {"summary": 42})
    [state] = checks.check_states(task.pk)
    assert state.latest.result == "passed" and state.latest.stale and not state.counts
    # Completion runs the check again on the bytes accepted now, and they fail it.
    refused = refusal_of(alice, task)
    assert refused.details["checks"][0]["result"] == "failed"
    rows = CheckResult.objects.filter(task=task).order_by("at")
    assert [(r.subject_id, r.result, r.stale) for r in rows] == [
        (first.pk, "passed", True),
        (second.pk, "failed", False),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_check_that_passed_before_a_replacement_cannot_authorise_success(fs_artifacts):
    """The passed result exists and is the newest one; the decision still refuses because its
    subject is no longer the accepted artifact (the replacement committed in between)."""
    alice = factories.agent()
    task = factories.task(alice, required_checks=REPORT_CHECKS[:1])
    accept_json(alice, task, {"summary": "v1"})
    checks.task_checks_run(alice.actor, task.pk)
    replacement = accept_json(alice, task, {"summary": "v2"})
    [state] = checks.check_states(task.pk)
    assert not state.counts
    done = completion.task_complete(alice.actor, task.pk)
    assert done.outcome == "succeeded"
    latest = checks.check_states(task.pk)[0].latest
    assert latest.subject_id == replacement.pk  # it was run again on the current bytes


class Broken(checks.Checker):
    name = "test_broken"

    def run(self, ctx, config):
        raise ConnectionError("the checking service is down")


class Slow(checks.Checker):
    name = "test_slow"
    gate = threading.Event()

    def run(self, ctx, config):
        self.gate.wait(30)
        return checks.Verdict("passed")


@pytest.fixture
def extra_checkers():
    broken, slow = checks.checker_register(Broken()), checks.checker_register(Slow())
    yield
    Slow.gate.set()
    checkers._REGISTRY.pop(broken.name, None)
    checkers._REGISTRY.pop(slow.name, None)


@pytest.mark.django_db(transaction=True)
def test_unavailable_and_timed_out_checkers_cannot_authorise_success(extra_checkers, settings):
    settings.CHECK_TIMEOUT_SECONDS = 0.3
    alice = factories.agent()
    task = factories.task(
        alice,
        required_checks=[
            {"name": "external", "checker": "test_broken", "config": {}},
            {"name": "slow", "checker": "test_slow", "config": {}},
        ],
    )
    refused = refusal_of(alice, task)
    by_name = {c["name"]: c for c in refused.details["checks"]}
    assert by_name["external"]["result"] == "unavailable"
    assert "the checking service is down" in by_name["external"]["reason"]
    assert by_name["slow"]["result"] == "timed_out"
    assert Task.objects.get(pk=task.pk).outcome is None
    # A checker this version no longer has is unavailable too, never a pass.
    checkers._REGISTRY.pop("test_broken")
    refused = refusal_of(alice, task)
    assert {c["name"]: c["result"] for c in refused.details["checks"]}["external"] == "unavailable"


@pytest.mark.django_db
def test_required_checks_are_validated_at_creation():
    alice = factories.agent()
    with pytest.raises(UnknownChecker):
        factories.task(alice, required_checks=[{"name": "x", "checker": "nope", "config": {}}])
    with pytest.raises(InvalidInput):
        factories.task(
            alice,
            required_checks=[
                {
                    "name": "x",
                    "checker": "json_schema",
                    "config": {"artifact": "a", "schema": {"type": 5}},
                }
            ],
        )
    with pytest.raises(InvalidInput):
        factories.task(
            alice,
            required_checks=[
                {"name": "x", "checker": "artifact_present", "config": {"artifact": "a"}},
                {"name": "x", "checker": "artifact_present", "config": {"artifact": "b"}},
            ],
        )
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_live_and_unresolved_operations_keep_the_task_from_succeeding():
    alice = factories.agent()
    task = factories.task(alice)
    op = factories.operation(alice, task, executor="agent")
    refused = refusal_of(alice, task)
    assert refused.details["operations"] == [{"id": op.pk, "status": "pending"}]
    with transaction.atomic():
        operation_transition_txn(op, "running", now=timezone.now(), actor="user:test")
        operation_transition_txn(op, "unresolved", now=timezone.now(), actor="user:test")
    refused = refusal_of(alice, task)
    assert refused.details["operations"] == [{"id": op.pk, "status": "unresolved"}]
    # The agent may end the attempt keeping the unresolved effect for support staff.
    ended = completion.task_complete(alice.actor, task.pk, if_unresolved="end_unresolved")
    assert (ended.condition, ended.outcome) == ("terminal", "unresolved")
    op.refresh_from_db()
    assert op.status == "unresolved"
    with pytest.raises(TaskRefused):
        completion.task_complete(alice.actor, task.pk)


@pytest.mark.django_db(transaction=True)
def test_only_the_tasks_agent_or_an_admin_completes_it():
    from runtime.errors import NotAuthorized, NotFound

    alice, mallory = factories.agent(), factories.agent()
    task = factories.task(alice)
    with pytest.raises(NotFound):
        completion.task_complete(mallory.actor, task.pk)
    with pytest.raises(NotAuthorized):
        completion.task_complete(factories.console_user("operator").actor, task.pk)
    assert completion.task_complete(factories.console_user("admin").actor, task.pk).outcome == (
        "succeeded"
    )


@pytest.mark.workers
@pytest.mark.django_db(transaction=True)
def test_a_check_run_as_a_worker_operation(workers, fs_artifacts, tmp_path):
    """The ``operation`` checker proposes the check tool as an operation of the task; a real
    worker runs it (reading the artifact's bytes from the same storage); completion waits for it,
    then succeeds on its verdict."""
    from runtime.models import Operation

    workers.start(1, ARTIFACT_ROOT=str(fs_artifacts))
    alice = factories.agent()
    task = factories.task(
        alice,
        required_checks=[
            {
                "name": "shape on a worker",
                "checker": "operation",
                "config": {
                    "artifact": "report.json",
                    "tool": "check.json_schema",
                    "params": {"schema": SCHEMA},
                },
            }
        ],
    )
    accept_json(alice, task, {"summary": "ok"})
    refused = refusal_of(alice, task)
    [check] = refused.details["checks"]
    assert check["reason"].startswith("running as operation op_")
    op_id = check["reason"].split()[-1]
    wait_for(
        lambda: Operation.objects.get(pk=op_id).status == "succeeded",
        timeout=60,
        what=f"the check operation to run:\n{workers.workers[0].tail()}",
    )
    done = completion.task_complete(alice.actor, task.pk)
    assert done.outcome == "succeeded"
    [state] = checks.check_states(task.pk)
    assert state.latest.result == "passed" and state.latest.checker == "operation"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_replacement_committing_during_completion_refuses_success(fs_artifacts):
    """Real concurrency on PostgreSQL: the check passed on v1; an acceptance of v2 holds its
    transaction open (named point, after its guarded UPDATE of the task row); completion starts,
    sees the v1 check as current, and is observed waiting on the task's row lock; when v2
    commits, the decision under the lock finds the check stale and refuses."""
    from django.db import connection

    alice = factories.agent()
    task = factories.task(alice, required_checks=REPORT_CHECKS[1:])
    accept_json(alice, task, {"summary": "v1"})
    [state] = checks.task_checks_run(alice.actor, task.pk)
    assert state.counts
    v2 = artifact_upload(
        alice.actor,
        task.pk,
        UploadSpec(name="report.json", media_type="application/json"),
        io.BytesIO(b'{"summary": "v2"}'),
    )
    expected = Task.objects.get(pk=task.pk).state_version
    inside, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold() -> None:
        inside.set()
        assert release.wait(30)

    def accept() -> None:
        try:
            outcome["accept"] = artifact_accept(
                alice.actor, v2.pk, expected_state_version=expected
            ).status
        finally:
            connection.close()

    def complete() -> None:
        try:
            outcome["complete"] = completion.task_complete(alice.actor, task.pk).outcome
        except Exception as exc:
            outcome["complete"] = exc
        finally:
            connection.close()

    with crash_point_installed("artifact.accept_before_commit", hold):
        a = threading.Thread(target=accept)
        a.start()
        assert inside.wait(30)
        c = threading.Thread(target=complete)
        c.start()

        def completion_waits() -> bool:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                return bool(cur.fetchone()[0])

        wait_for(completion_waits, what="completion to wait on the task's row lock")
        release.set()
        a.join(30)
        c.join(30)
    assert outcome["accept"] == "accepted"
    refused = outcome["complete"]
    assert isinstance(refused, CompletionRefused), refused
    assert "stale" in refused.details["checks"][0]["reason"]
    assert Task.objects.get(pk=task.pk).outcome is None


@pytest.mark.django_db(transaction=True)
def test_partial_artifacts_of_a_failed_task_are_kept_with_their_verification(fs_artifacts):
    from runtime.cancellation import task_fail
    from runtime.sweeper import sweep_once

    alice = factories.agent()
    task = factories.task(alice, required_checks=REPORT_CHECKS[1:])
    partial = accept_json(alice, task, {"draft": True})
    refusal_of(alice, task)
    task_fail(alice.actor, task.pk, "gave up")
    sweep_once()
    kept = artifact_get(alice.actor, partial.pk)
    assert kept.status == "accepted"
    assert verification_of(kept, checks.check_history(alice.actor, task.pk)) == "failed"
    _, stream = artifact_content(alice.actor, partial.pk)
    with stream:
        assert json.loads(stream.read()) == {"draft": True}


def test_reconciliation_runs_at_its_own_pace(settings):
    from datetime import timedelta

    settings.ARTIFACT_RECONCILE_SECONDS = 300
    now = timezone.now()
    assert reconcile_due(now, None)
    assert not reconcile_due(now, now - timedelta(seconds=299))
    assert reconcile_due(now, now - timedelta(seconds=300))


@pytest.mark.django_db
def test_a_parent_cannot_succeed_while_a_child_is_still_going():
    from runtime.cancellation import task_fail
    from runtime.errors import CompletionRefused

    owner = factories.agent()
    parent = factories.task(owner)
    child = factories.task(owner, parent=parent.pk)
    with pytest.raises(CompletionRefused) as refused:
        completion.task_complete(owner.actor, parent.pk)
    assert refused.value.details["children"] == [child.pk]
    assert Task.objects.get(pk=parent.pk).outcome is None
    task_fail(owner.actor, child.pk, reason="the child gave up")
    assert completion.task_complete(owner.actor, parent.pk).outcome == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_check_operation_that_failed_runs_again_in_a_new_attempt(fs_artifacts):
    from runtime.attempts import attempt_create
    from runtime.models import Operation

    alice = factories.agent()
    config = {"artifact": "report.json", "tool": "check.json_schema", "params": {"schema": SCHEMA}}
    task = factories.task(
        alice, required_checks=[{"name": "shape", "checker": "operation", "config": config}]
    )
    accept_json(alice, task, {"summary": "ok"})
    [first] = refusal_of(alice, task).details["checks"]
    first_op = first["reason"].split()[-1]
    Operation.objects.filter(pk=first_op).update(status="failed")  # the checker's run failed
    [failed] = refusal_of(alice, task).details["checks"]
    assert failed["reason"] != first["reason"]  # these bytes, this attempt: failed, not rerun
    attempt_create(alice.actor, task.pk, reason="try again")
    [again] = refusal_of(alice, task).details["checks"]
    assert again["reason"].startswith("running as operation op_")
    assert again["reason"].split()[-1] != first_op
