"""Tasks: the requested work. Services (writes) and selectors (reads)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from runtime.actors import Actor
from runtime.budget_allocations import child_allocate_txn
from runtime.budgets import budget_validate, ledger_open_txn
from runtime.checkers import required_checks_create_txn, required_checks_validate
from runtime.db import db_datetime, fetchone_named, prepared_cursor
from runtime.errors import InvalidInput, NotAuthorized, NotFound
from runtime.events import event_append_txn
from runtime.keys import (
    given_key_check,
    key_in_namespace,
    key_legacy,
    key_namespace,
    key_namespace_of,
)
from runtime.models import Approval, Attempt, Operation, Task, TaskCount
from runtime.policy import (
    can_create_child,
    can_create_task,
    can_read_budget,
    task_scope,
    task_scope_sql,
)
from runtime.rules.admission import task_admission_check
from runtime.rules.statuses import OperationStatus, TaskCondition, TaskOutcome
from runtime.selectors.budgets import MeterView, budget_meters
from runtime.sqlfiles import queries
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


MAX_EXTERNAL_ID = 200


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
    limits = spec.limits
    deadline = now + timedelta(seconds=spec.deadline_seconds) if spec.deadline_seconds else None
    parent = _parent_lock_txn(actor, spec.parent, now=now) if spec.parent else None
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
    if limits:
        Task.objects.filter(pk=task.pk).update(budget=limits)
    task.refresh_from_db()
    return task


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


def task_get(actor: Actor, task_id: str) -> Task:
    """The task if the actor may see it; NotFound otherwise (never reveals existence)."""
    task = (
        Task.objects.filter(task_scope(actor), pk=task_id).select_related("current_attempt").first()
    )
    if task is None:
        raise NotFound("no such task")
    return task


# What a proposal reads of its task (the rest of the row is deferred: read on first use).
_PROPOSAL_FIELDS = ["id", "agent_id", "created_by_id", "current_attempt_id", "deadline", "budget"]
_SQL = queries("task_for_proposal", slots={})


def task_for_proposal(actor: Actor, task_id: str) -> Task | None:
    """The task a proposal goes into, if the actor may see it, with its current attempt's number
    as ``attempt_number`` (None without one). Written as SQL, and only the columns a proposal
    uses, because it runs once per proposal, where building the model through a queryset cost
    more CPU than the query itself."""
    scope, params = task_scope_sql(actor, "t")
    with prepared_cursor() as cur:
        cur.execute(_SQL["task_for_proposal"] + " " + scope, [task_id, *params])
        row = fetchone_named(cur)
    if row is None:
        return None
    budget = row["budget"]
    if isinstance(budget, str):
        budget = json.loads(budget)
    deadline = db_datetime(row["deadline"])
    task = Task.from_db(
        connection.alias,
        _PROPOSAL_FIELDS,
        [
            row["id"],
            row["agent_id"],
            row["created_by_id"],
            row["current_attempt_id"],
            deadline,
            budget,
        ],
    )
    task.attempt_number = row["attempt_number"]  # type: ignore[attr-defined]
    return task


def task_budget_read(actor: Actor, task_id: str) -> tuple[Task, list[MeterView]]:
    """The task and the meters of its current attempt's ledger (policy.can_read_budget)."""
    task = task_get(actor, task_id)
    can_read_budget(actor, task)
    return task, budget_meters(task)


def task_list(
    actor: Actor,
    *,
    condition: str | None = None,
    outcome: str | None = None,
    search: str | None = None,
    schedule: str | None = None,
    external_id: str | None = None,
    before: tuple[datetime, str] | None = None,
    limit: int = 50,
) -> list[Task]:
    """The actor's tasks, newest first, by keyset (``before`` = (created_at, id) of the last row
    of the previous page): no OFFSET, no count. ``search`` finds a task by a part of its name,
    or by what it owns named exactly (``task_search_owner``); ``schedule``, the tasks that
    schedule started; ``external_id``, the task created under that key (one per owner)."""
    if condition and condition not in TaskCondition.ALL:
        raise InvalidInput(f"condition must be one of {', '.join(TaskCondition.ALL)}")
    if outcome and outcome not in TaskOutcome.ALL:
        raise InvalidInput(f"outcome must be one of {', '.join(TaskOutcome.ALL)}")
    qs: QuerySet[Task] = Task.objects.filter(task_scope(actor)).select_related("current_attempt")
    if condition:
        qs = qs.filter(condition=condition)
    if outcome:
        qs = qs.filter(outcome=outcome)
    if schedule:
        qs = qs.filter(schedule_id=schedule)
    if external_id:
        qs = qs.filter(external_id=external_id)
    if search:
        qs = qs.filter(Q(name__icontains=search) | task_search_owner(search))
    if before is not None:
        at, last_id = before
        qs = qs.filter(created_at__lt=at) | qs.filter(created_at=at, id__lt=last_id)
    return list(qs.order_by("-created_at", "-id")[:limit])


# Longer text is no id or key of ours (keys are at most 400 characters).
_SEARCH_ID_MAX = 400


def _operations_keyed(text: str) -> QuerySet[Operation] | None:
    """The operations stored under the idempotency key ``text`` (as the API and console show
    it: inside its owner's namespace), found through the owner's tasks and the per-task unique
    key index; None for text that names no owner's namespace."""
    namespace = key_namespace_of(text)
    if namespace.startswith("agt_"):
        owner = Q(task__agent_id=namespace)
    elif namespace.startswith("usr_") and namespace[4:].isdigit():
        owner = Q(task__agent_id__isnull=True, task__created_by_id=int(namespace[4:]))
    else:
        return None
    return Operation.objects.filter(owner, idempotency_key=text)


def task_search_owner(text: str) -> Q:
    """Tasks that own what ``text`` names exactly: the task's id or external id, an operation's
    or an approval's id, or an operation's idempotency key. Each is found by a primary key or a
    unique index, never by scanning operations. Pure (builds the condition)."""
    if not text or len(text) > _SEARCH_ID_MAX:
        return Q(pk__in=[])
    # A caller's key may hold spaces (ids never do); the key leads its unique indexes.
    keyed_task = Q(external_id=text) if len(text) <= MAX_EXTERNAL_ID else Q(pk__in=[])
    if any(c.isspace() for c in text):
        return keyed_task
    found = (
        Q(pk=text)
        | Q(pk__in=Operation.objects.filter(pk=text).values("task_id"))
        | Q(pk__in=Approval.objects.filter(pk=text).values("task_id"))
    )
    keyed = _operations_keyed(text)
    if keyed is not None:
        found |= Q(pk__in=keyed.values("task_id"))
    return found | keyed_task


@dataclass(frozen=True)
class SearchHit:
    """What a search text named exactly, besides a task: an operation (by its id or its key)
    or an approval, with the task that owns it."""

    kind: str  # "operation" | "approval"
    id: str
    operation_id: str
    task_id: str


def task_search_hits(actor: Actor, text: str) -> list[SearchHit]:
    """The operations and approvals within the actor's tasks that ``text`` names exactly (by
    id or idempotency key); empty for text that cannot be an id. Preconditions: none."""
    if not text or len(text) > _SEARCH_ID_MAX or any(c.isspace() for c in text):
        return []
    named = Q(pk=text)
    keyed = _operations_keyed(text)
    if keyed is not None:
        named |= Q(pk__in=keyed.values("pk"))
    hits = [
        SearchHit("operation", op_id, op_id, task_id)
        for op_id, task_id in Operation.objects.filter(named, task_scope(actor, "task__"))
        .order_by("created_at", "id")
        .values_list("pk", "task_id")[:20]
    ]
    hits += [
        SearchHit("approval", approval_id, op_id, task_id)
        for approval_id, op_id, task_id in Approval.objects.filter(
            task_scope(actor, "task__"), pk=text
        ).values_list("pk", "operation_id", "task_id")[:1]
    ]
    return hits


def task_list_by_ids(actor: Actor, ids: list[str]) -> list[Task]:
    """The named tasks the actor may see (a selector for short lists, such as the dashboard's)."""
    if not ids:
        return []
    return list(Task.objects.filter(task_scope(actor), pk__in=ids))


def task_pending_operation_ids(task: Task) -> list[str]:
    return tasks_pending_operation_ids([task.pk])[task.pk]


def tasks_pending_operation_ids(task_ids: list[str], per_task: int = 100) -> dict[str, list[str]]:
    """Each task's unsettled operations, oldest first, for a whole page of tasks in one query
    (never one query per row)."""
    S = OperationStatus
    live = [s for s in S.ALL if s not in S.FINAL]
    pending: dict[str, list[str]] = {task_id: [] for task_id in task_ids}
    rows = (
        Operation.objects.filter(task_id__in=task_ids, status__in=live)
        .order_by("created_at", "id")
        .values_list("task_id", "id")
    )
    for task_id, op_id in rows:
        if len(pending[task_id]) < per_task:
            pending[task_id].append(op_id)
    return pending


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


def task_counts() -> dict[tuple[str, str | None], int]:
    """Tasks by (condition, outcome) for the dashboard, from the counters the database keeps
    (a few rows, whatever the number of tasks; no count over the task table)."""
    rows = TaskCount.objects.values("condition", "outcome").annotate(total=Sum("n")).order_by()
    return {(r["condition"], r["outcome"] or None): int(r["total"]) for r in rows if r["total"]}


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
