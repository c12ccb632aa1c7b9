"""Retention (issue 40 point 1): ended tasks with their rows, and Idempotency-Key records past
their window, are archived as JSON lines in the artifact storage and then removed; nothing live
or still to be settled by a person is touched, also under a concurrent transaction."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.db.models import ForeignKey
from django.utils import timezone

from runtime import retention as retention_service
from runtime import sweeper
from runtime.artifact_store import artifact_storage
from runtime.completion import task_complete
from runtime.crashpoints import crash_point_installed
from runtime.models import (
    Approval,
    Artifact,
    Attempt,
    AuditRecord,
    BudgetMeter,
    Event,
    IdempotentRequest,
    Invocation,
    NotificationEvent,
    NotificationTask,
    Operation,
    RateCounter,
    Task,
)
from runtime.retention import retention_run
from runtime.selectors.retention import PARTS
from tests import factories
from tests.concurrency import in_thread
from tests.conftest import wait_for

OLD = timedelta(days=40)


@pytest.fixture
def retention(settings: Any, fs_artifacts: Path) -> Path:
    settings.RETENTION_TASK_DAYS = 30
    settings.IDEMPOTENCY_KEY_HOURS = 24
    settings.RETENTION_BATCH = 2  # several batches in a small test
    settings.RETENTION_BATCHES = 50
    return fs_artifacts


def aged(task_id: str, by: timedelta = OLD) -> None:
    """The task last moved ``by`` ago (its row and its journal)."""
    then = timezone.now() - by
    Task.objects.filter(pk=task_id).update(updated_at=then)
    Event.objects.filter(task_id=task_id).update(at=then)


def ended_task(owner: factories.Principal, name: str = "ended") -> Task:
    """A task whose one operation ran (an invocation, journal events) and which then ended."""
    task = factories.task(owner, name)
    factories.operation(owner, task, params={"message": "hi"})
    factories.run_claimable(task.pk)
    return task_complete(owner.actor, task.pk)


def archive_lines(root: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((root / "retention").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@pytest.mark.django_db(transaction=True)
def test_only_ended_old_settled_work_goes(retention: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(retention_service, "ARCHIVE_READ", 1)  # a batch read in several parts
    owner = factories.agent()
    old = [ended_task(owner, f"old {n}") for n in range(3)]
    recent = ended_task(owner, "recent")
    live = factories.task(owner, "live")
    factories.operation(owner, live)
    unresolved_op = factories.unresolved_operation(owner)
    ended_unresolved = task_complete(
        owner.actor, unresolved_op.task_id, if_unresolved="end_unresolved"
    )
    assert ended_unresolved.condition == "terminal"
    # Ended, and yet an operation waits for a person's decision (written as if a race left it).
    waiting = ended_task(owner, "approval still open")
    Operation.objects.filter(task_id=waiting.pk).update(status="waiting_approval")
    for task in [*old, live, ended_unresolved, waiting]:
        aged(task.pk)
    old_ops = list(Operation.objects.filter(task__in=old).values_list("pk", flat=True))
    assert Invocation.objects.filter(operation_id__in=old_ops).exists()

    report = retention_run()

    assert report.tasks.count == 3
    assert not Task.objects.filter(pk__in=[t.pk for t in old]).exists()
    assert not Operation.objects.filter(pk__in=old_ops).exists()
    assert not Invocation.objects.filter(operation_id__in=old_ops).exists()
    assert not Event.objects.filter(task_id__in=[t.pk for t in old]).exists()
    assert not Attempt.objects.filter(task_id__in=[t.pk for t in old]).exists()
    kept = {recent.pk, live.pk, ended_unresolved.pk, waiting.pk}
    assert set(Task.objects.filter(pk__in=kept).values_list("pk", flat=True)) == kept
    assert Operation.objects.filter(task_id__in=kept).count() == 4
    assert report.tasks.rows["runtime_operation"] == 3
    assert sorted(line["task"] for line in archive_lines(retention)) == sorted(t.pk for t in old)
    # The removal is recorded by the system actor, batch by batch, with its counts.
    audits = list(AuditRecord.objects.filter(actor="system:retention").order_by("id"))
    assert sum(a.detail["tasks"] for a in audits) == 3
    assert all(a.subject.startswith("retention/") for a in audits)


@pytest.mark.django_db(transaction=True)
def test_the_archive_holds_every_row_removed(settings: Any, artifact_backend: str) -> None:
    """Read back through the storage (the filesystem, and S3), line by line."""
    settings.RETENTION_TASK_DAYS = 30
    owner = factories.agent()
    task = ended_task(owner)
    aged(task.pk)
    ops = list(Operation.objects.filter(task=task).values("pk", "params"))
    events = Event.objects.filter(task=task).count()

    report = retention_run()

    (name,) = report.archives
    assert name.startswith(f"retention/{timezone.now():%Y-%m-%d}/tasks-")
    with artifact_storage().open(name, "rb") as handle:
        lines = [json.loads(line) for line in handle.read().decode().splitlines()]
    assert [line["task"] for line in lines] == [task.pk]
    tables = lines[0]["tables"]
    assert [row["id"] for row in tables["runtime_task"]] == [task.pk]
    assert [(r["id"], r["params"]) for r in tables["runtime_operation"]] == [
        (op["pk"], op["params"]) for op in ops
    ]
    assert len(tables["runtime_event"]) == events
    assert len(tables["runtime_invocation"]) == 1
    assert tables["runtime_attempt"][0]["task_id"] == task.pk
    assert not Task.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_dry_run_changes_nothing_and_names_the_counts(retention: Path, capsys: Any) -> None:
    owner = factories.agent()
    old = [ended_task(owner, f"old {n}") for n in range(3)]
    for task in old:
        aged(task.pk)
    before = (Task.objects.count(), Operation.objects.count(), Event.objects.count())

    report = retention_run(dry_run=True)

    assert (Task.objects.count(), Operation.objects.count(), Event.objects.count()) == before
    assert report.tasks.count == 3
    assert report.tasks.rows["runtime_operation"] == 3
    assert report.tasks.oldest is not None and report.tasks.newest is not None
    assert not (retention / "retention").exists()
    assert not AuditRecord.objects.filter(actor="system:retention").exists()
    call_command("retention", "--dry-run")
    out = capsys.readouterr().out
    assert "would remove 3" in out and "runtime_operation: 3" in out
    assert Task.objects.count() == before[0]
    call_command("retention")
    assert "removed 3" in capsys.readouterr().out
    assert not Task.objects.filter(pk__in=[t.pk for t in old]).exists()


@pytest.mark.django_db(transaction=True)
def test_idempotency_key_records_go_after_their_window(retention: Path) -> None:
    def record(key: str) -> IdempotentRequest:
        return IdempotentRequest.objects.create(
            principal="agent:x",
            key=key,
            method="POST",
            path="/api/v1/tasks",
            body_hash="sha256:0",
            status=IdempotentRequest.STATUS_DONE,
            response_status=201,
            response_body={"id": key},
        )

    stale, fresh = record("stale"), record("fresh")
    IdempotentRequest.objects.filter(pk=stale.pk).update(
        created_at=timezone.now() - timedelta(hours=25)
    )

    assert retention_run(dry_run=True).idempotency_keys.count == 1
    report = retention_run()

    assert report.idempotency_keys.count == 1
    assert list(IdempotentRequest.objects.values_list("key", flat=True)) == [fresh.key]
    archived = [line for line in archive_lines(retention) if "row" in line]
    assert [(a["table"], a["row"]["key"], a["row"]["response_body"]) for a in archived] == [
        ("runtime_idempotentrequest", "stale", {"id": "stale"})
    ]
    assert (
        AuditRecord.objects.get(action="retention.idempotency_keys_removed").detail["records"] == 1
    )


@pytest.mark.django_db(transaction=True)
def test_off_keeps_everything(retention: Path, settings: Any) -> None:
    settings.RETENTION_TASK_DAYS = 0
    task = ended_task(factories.agent())
    aged(task.pk, timedelta(days=3000))
    assert retention_run().tasks.count == 0
    assert Task.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_parent_goes_with_its_children_only_when_all_of_them_may(retention: Path) -> None:
    owner = factories.agent()
    parent = factories.task(owner, "parent")
    child = factories.task(owner, "child")
    Task.objects.filter(pk=child.pk).update(parent=parent)  # (a child's budget is not the point)
    for task in (parent, child):
        aged(task.pk)
    Task.objects.filter(pk=parent.pk).update(condition="terminal", outcome="succeeded")
    # The child is still live: neither goes (nor would the child alone: it is not a root).
    assert retention_run().tasks.count == 0
    assert Task.objects.filter(pk__in=[parent.pk, child.pk]).count() == 2
    Task.objects.filter(pk=child.pk).update(condition="terminal", outcome="succeeded")
    aged(parent.pk)
    aged(child.pk)
    report = retention_run()
    assert report.tasks.count == report.tasks.rows["runtime_task"] == 2
    assert AuditRecord.objects.get(detail__trees=1).detail["tasks"] == 2
    assert not Task.objects.filter(pk__in=[parent.pk, child.pk]).exists()


def test_every_relation_to_a_task_s_rows_is_in_the_plan() -> None:
    """A new table pointing at a task (or at a row of one) must join PARTS, or a removal
    would fail on its foreign key (or leave it dangling)."""
    covered = {part.model for part in PARTS}
    owners = [Task, Operation, Attempt, Approval, Artifact, BudgetMeter, NotificationEvent]
    missing = []
    for model in owners:
        for rel in model._meta.related_objects:
            related = rel.related_model
            assert isinstance(related, type)
            if not isinstance(rel.field, ForeignKey) or related in covered:
                continue
            if related is not NotificationTask:  # kept: the day's task is never removed
                missing.append(f"{related.__name__}.{rel.field.name}")
    assert missing == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["holds_the_row", "committed_before_the_lock"])
def test_a_task_made_live_under_a_concurrent_transaction_is_left(
    retention: Path, when: str
) -> None:
    """Between retention's read (and archive) and its removal another transaction makes one
    task live again: while that transaction holds the row, retention passes over it (SKIP
    LOCKED); once it has committed, the check under retention's lock sees it. Either way the
    task and its rows stay, and the other old task of the batch still goes."""
    owner = factories.agent()
    revived, other = ended_task(owner, "revived"), ended_task(owner, "other")
    for task in (revived, other):
        aged(task.pk)
    changed, release = threading.Event(), threading.Event()

    def make_live() -> None:
        with transaction.atomic():
            row = Task.objects.select_for_update().get(pk=revived.pk)
            Task.objects.filter(pk=row.pk).update(
                condition="runnable",
                outcome=None,
                state_version=row.state_version + 1,
                updated_at=timezone.now(),
            )
            if when == "holds_the_row":
                changed.set()
                assert release.wait(30)
        changed.set()

    racer: list[threading.Thread] = []

    def during_retention() -> None:
        thread, _ = in_thread(make_live)
        racer.append(thread)
        assert changed.wait(30)

    with crash_point_installed("retention.archived", during_retention):
        report = retention_run()
    release.set()
    racer[0].join(30)

    assert Task.objects.get(pk=revived.pk).condition == "runnable"
    assert Operation.objects.filter(task_id=revived.pk).count() == 1
    assert Event.objects.filter(task_id=revived.pk).exists()
    assert not Task.objects.filter(pk=other.pk).exists()
    assert report.tasks.count == 1 and report.skipped == 1
    audit = AuditRecord.objects.get(actor="system:retention", detail__tasks=1)
    assert audit.detail["skipped"] == [revived.pk]


@pytest.mark.django_db
def test_rate_limit_counters_go_a_window_after_theirs_ended(settings: Any, capsys: Any) -> None:
    """Counters of the embedded mode's limits (failed logins, a token's pace) grew for ever: a
    run removes those whose window ended a whole window ago (a back-off is forgotten that
    long after its last wait), with every retention class off, and keeps the others."""
    settings.RETENTION_TASK_DAYS = 0
    settings.IDEMPOTENCY_KEY_HOURS = 0
    settings.RATE_WINDOW_SECONDS = 600
    now = timezone.now()
    for key, ends in (
        ("login:dead", now - timedelta(seconds=700)),
        ("login:backoff", now - timedelta(seconds=500)),  # still remembered
        ("token:live", now + timedelta(seconds=30)),
    ):
        RateCounter.objects.create(key=key, count=3, window_ends_at=ends)
    assert retention_service.retention_due(now, None)
    call_command("retention", "--dry-run")
    assert "rate-limit counters past their window: would remove 1" in capsys.readouterr().out
    assert RateCounter.objects.count() == 3
    report = retention_run(now)
    assert report.rate_counters.count == 1
    assert sorted(RateCounter.objects.values_list("key", flat=True)) == [
        "login:backoff",
        "token:live",
    ]


def test_beat_starts_a_run_every_retention_seconds(settings: Any) -> None:
    settings.RETENTION_SECONDS = 3600
    now = timezone.now()
    assert retention_service.retention_due(now, None)
    assert not retention_service.retention_due(now, now - timedelta(seconds=10))
    assert retention_service.retention_due(now, now - timedelta(hours=2))
    settings.RETENTION_SECONDS = 0
    assert not retention_service.retention_due(now, None)


@pytest.mark.django_db
def test_the_sweeper_hands_a_due_run_to_a_worker(settings: Any, monkeypatch: Any) -> None:
    published: list[str] = []
    monkeypatch.setattr(sweeper, "publish", lambda name, *args, **kw: published.append(name))
    monkeypatch.setattr(sweeper, "_last_retention", [])
    settings.RETENTION_SECONDS = 3600
    now = timezone.now()
    assert sweeper.retention_start(now) == 1
    assert sweeper.retention_start(now + timedelta(seconds=5)) == 0
    assert published == ["runtime.retention"]


@pytest.mark.workers
@pytest.mark.postgres
def test_beat_has_a_worker_run_it(workers: Any, tmp_path: Path) -> None:
    """As deployed: beat publishes the run by name, a worker process archives and removes."""
    owner = factories.agent()
    task = ended_task(owner)
    aged(task.pk)
    env = {"RETENTION_TASK_DAYS": 30, "ARTIFACT_ROOT": str(tmp_path / "store"), "SWEEP_SECONDS": 1}
    workers.start(count=1, concurrency=1, **env)
    workers.start_beat(**env)
    wait_for(
        lambda: not Task.objects.filter(pk=task.pk).exists(), timeout=60, what="retention to run"
    )
    assert AuditRecord.objects.get(actor="system:retention", detail__tasks=1)
    assert [line["task"] for line in archive_lines(tmp_path / "store")] == [task.pk]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_tree_whose_operation_another_transaction_holds_is_passed_over(
    retention: Path,
) -> None:
    """Retention takes the operation rows first (the global lock order) and never waits: one
    held by another transaction leaves its tree for a later run."""
    owner = factories.agent()
    held, other = ended_task(owner, "held"), ended_task(owner, "other")
    for task in (held, other):
        aged(task.pk)
    locked, release = threading.Event(), threading.Event()

    def hold_operation() -> None:
        with transaction.atomic():
            Operation.objects.select_for_update().filter(task_id=held.pk).first()
            locked.set()
            assert release.wait(30)

    thread, _ = in_thread(hold_operation)
    assert locked.wait(30)
    try:
        report = retention_run()
    finally:
        release.set()
        thread.join(30)

    assert Task.objects.filter(pk=held.pk).exists()
    assert not Task.objects.filter(pk=other.pk).exists()
    assert report.skipped == 1
    assert retention_run().tasks.count == 1  # the next run takes it
    assert not Task.objects.filter(pk=held.pk).exists()
