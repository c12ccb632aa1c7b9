"""Tasks: the requested work. Services (writes): the spec's checks, creation (with the first
attempt, the required checks and the ledger, or a child's allocation in its parent's), renewal
of what waits on a task's behalf, and the keys its operations are stored under. The reads are
in runtime.selectors.tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from runtime.actors import Actor
from runtime.budget_allocations import child_allocate_txn
from runtime.budgets import budget_validate, ledger_open_txn
from runtime.checkers import required_checks_create_txn, required_checks_validate
from runtime.errors import InvalidInput, NotAuthorized, NotFound
from runtime.events import event_append_txn
from runtime.keys import given_key_check, key_in_namespace, key_legacy, key_namespace
from runtime.models import Attempt, Operation, Task
from runtime.models.tasks import MAX_EXTERNAL_ID
from runtime.policy import can_create_child, can_create_task, task_scope
from runtime.rules.admission import task_admission_check
from runtime.text import name_check

MAX_DEADLINE_SECONDS = 366 * 24 * 3600


@dataclass
class TaskSpec:
    name: str
    input: dict[str, Any] = field(default_factory=dict)
    deadline_seconds: int | None = None
    budget: dict[str, Any] | None = None
    parent: str | None = None
    required_checks: list[dict[str, Any]] = field(default_factory=list)
    compensate_on: list[str] = field(default_factory=list)
    # The caller's key for the task (runtime.task_keys): creating under it again finds it.
    external_id: str | None = None


@dataclass(frozen=True)
class CheckedTaskSpec:
    """A TaskSpec whose domain limits ``task_spec_check`` checked: what a task is made from."""

    name: str
    input: dict[str, Any]
    deadline_seconds: int | None
    limits: dict[str, int]
    checks: list[dict[str, Any]]
    compensate_on: list[str]
    parent: str | None
    external_id: str | None = None


def task_spec_check(spec: TaskSpec) -> CheckedTaskSpec:
    """The spec's domain limits, checked: 400 ``invalid_input`` naming the field. Pure (also
    what a schedule's task template is checked with, runtime.schedules)."""
    name = spec.name.strip()
    if not name:
        raise InvalidInput("name must not be empty", field="name")
    if len(name) > 300:
        raise InvalidInput("name is longer than 300 characters", field="name")
    name_check(name, "name")
    if set(spec.compensate_on) - {"failed", "cancelled"}:
        raise InvalidInput(
            "compensate_on may hold only 'failed' and 'cancelled'", field="compensate_on"
        )
    if spec.deadline_seconds is not None and not (
        0 < spec.deadline_seconds <= MAX_DEADLINE_SECONDS
    ):
        raise InvalidInput(
            f"deadline_seconds must be between 1 and {MAX_DEADLINE_SECONDS}",
            field="deadline_seconds",
        )
    if spec.external_id is not None:
        external_id_check(spec.external_id)
    checks = required_checks_validate(spec.required_checks)
    try:
        limits = budget_validate(spec.budget)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, code=exc.code, field="budget") from None
    return CheckedTaskSpec(
        name=name,
        input=spec.input,
        deadline_seconds=spec.deadline_seconds,
        limits=limits,
        checks=checks,
        compensate_on=sorted(set(spec.compensate_on)),
        parent=spec.parent,
        external_id=spec.external_id,
    )


def external_id_check(external_id: str) -> str:
    """A caller's key for a task: 1 to MAX_EXTERNAL_ID characters, none hidden, no whitespace
    around it (400 ``invalid_input`` naming ``external_id``). Pure."""
    if not external_id or len(external_id) > MAX_EXTERNAL_ID:
        raise InvalidInput(
            f"external_id must have 1 to {MAX_EXTERNAL_ID} characters", field="external_id"
        )
    if external_id != external_id.strip():
        raise InvalidInput("external_id must not begin or end with whitespace", field="external_id")
    return name_check(external_id, "external_id")


def task_create(actor: Actor, spec: TaskSpec) -> Task:
    """Create a task with its first attempt and its ``task.created`` event.

    Preconditions: ``spec`` was parsed by the transport (types checked); domain limits are
    checked here.
    """
    can_create_task(actor)
    checked = task_spec_check(spec)
    with transaction.atomic():
        return task_create_txn(actor, checked, now=timezone.now())


def task_create_txn(
    actor: Actor,
    spec: CheckedTaskSpec,
    *,
    now: datetime,
    journal_actor: str | None = None,
    schedule_id: str | None = None,
    spec_hash: str = "",
) -> Task:
    """``task_create`` inside the caller's transaction, for ``actor`` (who owns the task).

    Preconditions: ``can_create_task(actor)`` holds and ``spec`` came from
    ``task_spec_check``. ``journal_actor`` names who caused the creation when it is not the
    owner (the scheduler, or the person who triggered a schedule); ``schedule_id`` is the
    schedule the task is started by. An ``external_id`` the owner already holds fails the
    insert (IntegrityError): runtime.task_keys creates under a key, and compares the
    ``spec_hash`` it stores (the input's canonical hash) later."""
    parent = _parent_lock_txn(actor, spec.parent, now=now) if spec.parent else None
    task, attempt = _task_insert_txn(
        actor, spec, parent=parent, now=now, schedule_id=schedule_id, spec_hash=spec_hash
    )
    data: dict[str, Any] = {"name": spec.name, "attempt": attempt.number, "parent": spec.parent}
    if schedule_id is not None:
        data["schedule"] = schedule_id
    event_append_txn(
        task_id=task.pk,
        type="task.created",
        state_version=task.state_version,
        now=now,
        actor=journal_actor or actor.label,
        data=data,
    )
    limits = _allowance_open_txn(actor, task, attempt, parent=parent, limits=spec.limits, now=now)
    if limits:
        Task.objects.filter(pk=task.pk).update(budget=limits)
    task.refresh_from_db()
    return task


def _task_insert_txn(
    actor: Actor,
    spec: CheckedTaskSpec,
    *,
    parent: Task | None,
    now: datetime,
    schedule_id: str | None,
    spec_hash: str,
) -> tuple[Task, Attempt]:
    """The task's row, its first attempt and its required checks."""
    deadline = now + timedelta(seconds=spec.deadline_seconds) if spec.deadline_seconds else None
    if parent is not None and parent.deadline is not None:
        # A child inherits its parent's deadline, or keeps a shorter one of its own.
        deadline = min(deadline, parent.deadline) if deadline else parent.deadline
    task = Task.objects.create(
        name=spec.name,
        input=spec.input,
        agent_id=actor.agent_id if actor.kind == "agent" else None,
        created_by_id=actor.user_id if actor.kind == "user" else None,
        deadline=deadline,
        compensate_on=spec.compensate_on,
        parent=parent,
        schedule_id=schedule_id,
        external_id=spec.external_id,
        spec_hash=spec_hash,
    )
    attempt = Attempt.objects.create(task=task, number=1, created_by=actor.label)
    required_checks_create_txn(task, spec.checks)
    Task.objects.filter(pk=task.pk).update(current_attempt=attempt)
    task.current_attempt = attempt
    return task, attempt


def _allowance_open_txn(
    actor: Actor,
    task: Task,
    attempt: Attempt,
    *,
    parent: Task | None,
    limits: dict[str, int],
    now: datetime,
) -> dict[str, int]:
    """The new task's ledger: a child's allocation drawn from its parent's (journaled in the
    parent), or the task's own limits. Returns the limits the task got."""
    if parent is not None:
        limits = child_allocate_txn(
            parent=parent, child=task, attempt=attempt, requested=limits, now=now
        )
        event_append_txn(
            task_id=parent.pk,
            type="task.child_created",
            state_version=parent.state_version,
            now=now,
            actor=actor.label,
            data={"child": task.pk, "allocation": limits},
        )
    elif limits:
        ledger_open_txn(task=task, attempt=attempt, limits=limits)
    return limits


def _parent_lock_txn(actor: Actor, parent_id: str, *, now: datetime) -> Task:
    """The parent, locked, if the actor may see it and it still admits work: a child cannot be
    born to a task that is stopping (the cancel holds this lock while it acknowledges)."""
    parent = Task.objects.filter(task_scope(actor), pk=parent_id).first()
    if parent is None:
        raise NotFound("no such parent task")
    can_create_child(actor, parent)
    parent = Task.objects.select_for_update().get(pk=parent_id)
    task_admission_check(
        condition=parent.condition,
        cancellation=parent.cancellation,
        paused=parent.paused,
        deadline=parent.deadline,
        now=now,
    )
    return parent


def within_task_deadline(expires_at: datetime, deadline: datetime | None) -> datetime:
    """The validity of anything that waits on a task's behalf (an approval, a durable wait, a
    timer): never beyond the task's deadline. Pure; for the services that create them."""
    return expires_at if deadline is None else min(expires_at, deadline)


def task_renewal_txn(task_id: str, until: datetime, now: datetime) -> datetime:
    """For renewing something that waits on the task's behalf (an expired approval or wait):
    lock the task row (after the operation's: lock order) and refuse (409) when the task no
    longer admits work (cancelled, ended, past its deadline); a paused task keeps its waits.
    Returns ``until`` capped at the task's deadline."""
    task = Task.objects.select_for_update().get(pk=task_id)
    task_admission_check(
        condition=task.condition,
        cancellation=task.cancellation,
        paused=False,
        deadline=task.deadline,
        now=now,
    )
    return within_task_deadline(until, task.deadline)


def operation_key(task: Task, key: str) -> str:
    """The key an operation of ``task`` is stored and invoked under: inside its owner's
    namespace. NotAuthorized for a key inside another owner's namespace."""
    namespace = key_namespace(agent_id=task.agent_id, user_id=task.created_by_id)
    try:
        return key_in_namespace(namespace, key)
    except ValueError:
        raise NotAuthorized(
            "idempotency_key is inside another owner's namespace", code="key_outside_namespace"
        ) from None


def given_key_validate(key: str | None) -> None:
    """Refuse (400 ``invalid_input``) a caller's idempotency key in a derived key's shape."""
    if key is None:
        return
    try:
        given_key_check(key)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="idempotency_key") from None


def operation_by_legacy_key(
    task: Task, derived: str, *, kind: str, tool: str, step: str, intent_version: int
) -> Operation | None:
    """The operation stored, before keys' parts were escaped, under the legacy form of the
    derived key ``derived`` (runtime.keys.key_legacy) for this very intent: same task,
    attempt, kind, tool, step and intent version. None when the key had nothing to escape (no
    statement then) or the legacy key is another intent's (that one keeps it)."""
    legacy = key_legacy(derived)
    if legacy == derived:
        return None
    return Operation.objects.filter(
        task=task,
        idempotency_key=operation_key(task, legacy),
        attempt_id=task.current_attempt_id or "",
        kind=kind,
        tool=tool,
        step=step,
        intent_version=intent_version,
    ).first()
