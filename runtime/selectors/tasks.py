"""Reads of tasks (selectors): one task or a page of them (scoped by runtime.policy), the
search by what a task owns, the task a proposal goes into (as SQL: it runs once per proposal),
its budget, its pending operations, and the dashboard's counts."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet, Sum, TextField
from django.db.models.functions import Cast

from runtime.actors import Actor
from runtime.db import db_datetime, fetchone_named, prepared_cursor
from runtime.errors import InvalidInput, NotFound
from runtime.keys import key_namespace_of
from runtime.models import Approval, Operation, Task, TaskCount
from runtime.models.tasks import MAX_EXTERNAL_ID
from runtime.policy import can_read_budget, task_scope, task_scope_sql
from runtime.rules.statuses import OperationStatus, TaskCondition, TaskOutcome
from runtime.selectors.budgets import MeterView, budget_meters
from runtime.sqlfiles import queries


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
    created_since: datetime | None = None,
    created_until: datetime | None = None,
    param: tuple[str, str] | None = None,
) -> list[Task]:
    """The actor's tasks, newest first, by keyset (``before`` = (created_at, id) of the last row
    of the previous page): no OFFSET, no count. ``search`` finds a task by a part of its name,
    or by what it owns named exactly (``task_search_owner``); ``schedule``, the tasks that
    schedule started; ``external_id``, the task created under that key (one per owner);
    ``created_since``/``created_until``, created in that range (the end excluded); ``param``,
    a (key, value) one of its operations carries among its parameters (``task_param_match``)."""
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
        qs = qs.filter(
            Q(name__icontains=search) | task_search_owner(search) | task_search_params(search)
        )
    if created_since is not None:
        qs = qs.filter(created_at__gte=created_since)
    if created_until is not None:
        qs = qs.filter(created_at__lt=created_until)
    if param is not None:
        qs = qs.filter(task_param_match(*param))
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


# How many of the latest operations a search reads the parameters of: a value people look up
# ("acct-1042") is recent work's, and the search stays one bounded scan, not the whole table.
SEARCH_PARAMS_RECENT = 5000


def task_search_params(text: str) -> Q:
    """Tasks whose recent operations (the latest SEARCH_PARAMS_RECENT) carry ``text`` in their
    parameters (a value, as its JSON text holds it; three characters at least). Pure."""
    if len(text) < 3 or len(text) > _SEARCH_ID_MAX:
        return Q(pk__in=[])
    recent = Operation.objects.order_by("-created_at").values("pk")[:SEARCH_PARAMS_RECENT]
    holding = (
        Operation.objects.filter(pk__in=recent)
        .annotate(params_text=Cast("params", TextField()))
        .filter(params_text__icontains=text)
    )
    return Q(pk__in=holding.values("task_id"))


# A parameter's name as a filter takes it: a top-level key of the parameters.
_PARAM_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def task_param_match(key: str, value: str) -> Q:
    """Tasks one of whose operations has ``value`` under the top-level parameter ``key`` (as
    text; a whole number also as the number). Found through each task's operations, by the
    operation's task index (not a scan of all parameters). Pure; InvalidInput for a key that is
    no parameter's name."""
    if not _PARAM_KEY.match(key) or "__" in key:
        raise InvalidInput(
            "a parameter filter is name=value, the name letters, digits, '_', '.', '-'",
            field="param",
        )
    if len(value) > _SEARCH_ID_MAX:
        raise InvalidInput("the parameter's value is too long", field="param")
    lookup = f"params__{key}"
    matches = Q(**{lookup: value})
    if re.fullmatch(r"-?[0-9]{1,15}", value):
        matches |= Q(**{lookup: int(value)})
    return Q(Exists(Operation.objects.filter(matches, task_id=OuterRef("pk"))))


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


def task_counts() -> dict[tuple[str, str | None], int]:
    """Tasks by (condition, outcome) for the dashboard, from the counters the database keeps
    (a few rows, whatever the number of tasks; no count over the task table)."""
    rows = TaskCount.objects.values("condition", "outcome").annotate(total=Sum("n")).order_by()
    return {(r["condition"], r["outcome"] or None): int(r["total"]) for r in rows if r["total"]}
