"""The console for people: server-rendered pages with a light live layer (a websocket that
follows the journal; the page re-fetches its server-rendered fragments on each event)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.api.errors import error_body
from console.api.serializers import cursor_decode, cursor_encode, event_out
from console.middleware import is_api, refusal
from console.web.decorators import console_view
from console.web.formats import day_start, elapsed, param_filter
from console.web.interrupted import form_expired
from console.web.outcomes import outcomes_context
from runtime import attempts, cancellation, policy
from runtime import events as journal
from runtime.actors import Actor
from runtime.control import commands_of_task
from runtime.errors import InvalidInput
from runtime.models import Operation, RejectedObservation
from runtime.rules.statuses import OperationStatus, TaskCondition, TaskOutcome
from runtime.saved_views import saved_view_delete, saved_view_save, view_query
from runtime.selectors import budgets, tasks
from runtime.selectors.approvals import approvals_of_task, pending_approval_count
from runtime.selectors.notifications import task_watching
from runtime.selectors.operations import operation_list
from runtime.selectors.signals import signals_of_task
from runtime.selectors.views import saved_views_of
from runtime.selectors.waits import expired_wait_count, waits_of_task

# Django's handlers for what fails outside a view (a malformed multipart body read by the CSRF
# check, an unknown URL, an uncaught fault): the contract's JSON under /api/, a page otherwise.


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return refusal(request, 400, "malformed_request", "the request is malformed")


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return refusal(request, 403, "not_authorized", "not authorized")


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if is_api(request):
        return refusal(request, 403, "not_authorized", "the form's CSRF check failed")
    # A page form: nothing was done; back to its page, told so (not a bare refusal).
    return form_expired(request)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return refusal(request, 404, "not_found", "not found")


def server_error(request: HttpRequest) -> HttpResponse:
    # No template and no database here: whatever failed may fail again.
    if is_api(request):
        return JsonResponse(error_body("internal_error", "internal server error"), status=500)
    return HttpResponse(
        "<!doctype html><title>Server error</title><h1>Server error</h1>",
        status=500,
        content_type="text/html; charset=utf-8",
    )


@require_GET
@console_view
def dashboard(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/dashboard.html", _dashboard_context(actor))


@require_GET
@console_view
def dashboard_fragment(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/_dashboard_body.html", _dashboard_context(actor))


_NEEDS_SUPPORT = (OperationStatus.UNRESOLVED, OperationStatus.MANUAL_INTERVENTION)


def _dashboard_context(actor: Actor) -> dict[str, Any]:
    counts = tasks.task_counts()
    unresolved = Operation.objects.filter(status__in=_NEEDS_SUPPORT)
    by_condition = {c: 0 for c in TaskCondition.ALL}
    by_outcome = {o: 0 for o in TaskOutcome.ALL}
    for (condition, outcome), n in counts.items():
        by_condition[condition] = by_condition.get(condition, 0) + n
        if outcome:
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    return {
        "by_condition": by_condition,
        "by_outcome": by_outcome,
        "recent": tasks.task_list(actor, limit=10),
        "near_limit": _near_limit(actor),
        "feed_head": journal.feed_head(),
        "needs": {
            "approvals": pending_approval_count(),
            "waits": expired_wait_count(),
            # The /unresolved/ queue's own statuses: the count is the queue's length.
            "unresolved": unresolved.count(),
        },
        # Tasks still open with an operation in that queue: their outcome is not written yet,
        # so the outcome table (ended tasks) cannot count them; said beside it.
        "open_unresolved_tasks": unresolved.values("task_id").distinct().count(),
    }


def _near_limit(actor: Actor) -> list[dict[str, Any]]:
    """Live tasks with a meter at least 80% committed (reserved, posted or unknown), within what
    the actor may see."""
    rows = budgets.tasks_near_limit(threshold=0.8)
    visible = {t.pk: t for t in tasks.task_list_by_ids(actor, [task_id for task_id, _, _ in rows])}
    return [
        {"task": visible[task_id], "meter": meter, "percent": round(used * 100)}
        for task_id, meter, used in rows
        if task_id in visible
    ]


@require_GET
@console_view
def task_list(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/task_list.html", _task_list_context(request, actor))


@require_GET
@console_view
def task_list_fragment(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/_task_rows.html", _task_list_context(request, actor))


def _task_list_context(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    condition = request.GET.get("condition") or None
    outcome = request.GET.get("outcome") or None
    q = (request.GET.get("q") or "").strip() or None
    before_raw = request.GET.get("before")
    before = cursor_decode(before_raw) if before_raw else None
    since, until = (request.GET.get(k, "").strip() for k in ("since", "until"))
    param = (request.GET.get("param") or "").strip()
    page_size = 25
    rows = tasks.task_list(
        actor,
        condition=condition,
        outcome=outcome,
        search=q,
        before=before,
        limit=page_size + 1,
        created_since=day_start(since, "since") if since else None,
        created_until=day_start(until, "until", after=True) if until else None,
        param=param_filter(param) if param else None,
    )
    page = rows[:page_size]
    return {
        "since": since,
        "until": until,
        "param": param,
        "saved_views": saved_views_of(actor, "tasks"),
        "view_query": _view_query(request),
        "tasks": page,
        "next_cursor": cursor_encode(page[-1].created_at, page[-1].pk)
        if len(rows) > page_size
        else None,
        "condition": condition or "",
        "outcome": outcome or "",
        "q": q or "",
        # What the text names exactly besides a task (an operation, by id or key; an approval).
        "hits": tasks.task_search_hits(actor, q) if q and not before_raw else [],
        "conditions": TaskCondition.ALL,
        "outcomes": TaskOutcome.ALL,
        "paged": bool(before_raw),
        "feed_head": journal.feed_head(),
    }


# The page renders at most this many events; the websocket catches up the rest from last_seq.
TIMELINE_FIRST_PAGE = 1000


@require_GET
@console_view
def task_detail(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    context = _task_context(actor, task_id)
    events = journal.events_after(task_id, 0, limit=TIMELINE_FIRST_PAGE)
    context["events"] = timeline_entries(
        events, {row["op"].pk: row["op"].step for row in context["operations"]}
    )
    context["last_seq"] = events[-1].seq if events else 0
    context["input_text"] = json_text(context["task"].input)
    context["can_watch"] = policy.allowed(policy.can_watch_task, actor, context["task"])
    context["watching"] = task_watching(actor, task_id)

    context.update(outcomes_context(actor, task_id))
    return render(request, "console/task_detail.html", context)


def json_text(value: Any) -> str:
    """JSON as people read it (what the API returns), not Python's repr; escaped by the
    template like any other text."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def timeline_entries(events: list[Any], steps: dict[str, str]) -> list[dict[str, Any]]:
    """The task page's timeline, as console.js renders an event that arrives live: its time in
    UTC ("YYYY-MM-DD HH:MM:SS UTC"), the step of its operation (``steps``, else the step its
    proposal recorded) and how long after that operation's previous event it came."""
    previous: dict[str, Any] = {}
    entries = []
    for event in events:
        entry = event_out(event)
        entry["at_display"] = (entry["at"] or "")[:19].replace("T", " ") + " UTC"
        op = event.operation_id
        if op:
            entry["step"] = steps.get(op) or (event.data or {}).get("step") or ""
            if op in previous:
                entry["after"] = elapsed((event.at - previous[op]).total_seconds())
            previous[op] = event.at
        entries.append(entry)
    return entries


@require_GET
@console_view
def task_fragment(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    return render(request, "console/_task_live.html", _task_context(actor, task_id))


def _task_context(actor: Actor, task_id: str) -> dict[str, Any]:
    task = tasks.task_get(actor, task_id)
    ops: list[Operation] = operation_list(actor, task_id=task_id, limit=500)
    rejections = list(
        RejectedObservation.objects.filter(operation__task_id=task_id).order_by("-at", "-id")[:50]
    )
    return {
        "task": task,
        "can_cancel": policy.allowed(policy.can_cancel, actor, task),
        "can_start_attempt": policy.allowed(policy.can_start_attempt, actor, task),
        "meters": budgets.budget_meters(task)
        if policy.allowed(policy.can_read_budget, actor, task)
        else [],
        "time_left": _time_left(task.deadline),
        "attempts": attempts.attempts_of(task),
        "children": list(task.children.order_by("created_at", "id")[:100]),
        "operations": [
            {
                "op": op,
                "result": None if op.result is None else json_text(op.result),
                "error": op.error if isinstance(op.error, dict) else None,
                "error_text": None if op.error is None else json_text(op.error),
            }
            for op in ops
        ],
        "rejections": [{"r": r, "detail": json_text(r.detail)} for r in rejections],
        **_task_people_context(actor, task),
    }


def time_left(until: datetime | None, now: datetime) -> str:
    if until is None:
        return ""
    seconds = int((until - now).total_seconds())
    if seconds <= 0:
        return "expired"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _task_people_context(actor: Actor, task: Any) -> dict[str, Any]:
    """The task page's human side: approvals with their history, waits, signals with their
    dispositions, control commands, and whether this person may pause, resume and steer."""
    now = timezone.now()
    return {
        "approvals": [{"a": a, "params": json_text(a.params)} for a in approvals_of_task(task.pk)],
        "waits": [
            {**w, "left": time_left(w["until"], now) if w["op"].status == "waiting" else ""}
            for w in waits_of_task(task.pk)
        ],
        "signals": [{"s": s, "payload": json_text(s.payload)} for s in signals_of_task(task.pk)],
        "commands": commands_of_task(task.pk),
        "can_control": policy.allowed(policy.can_control_task, actor, task),
    }


def _time_left(deadline: Any) -> str | None:
    """The deadline's remaining time as people read it ("4m 05s left", "passed")."""
    if deadline is None:
        return None
    seconds = int((deadline - timezone.now()).total_seconds())
    if seconds <= 0:
        return "passed"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m left"
    return f"{minutes}m {secs:02d}s left"


@require_POST
@console_view
def task_cancel(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    """An admin stops a task from its page (the service checks the right)."""
    reason = request.POST.get("reason", "")
    if len(reason) > 2000:
        raise InvalidInput("reason is longer than 2000 characters")
    task = cancellation.task_cancel(actor, task_id, reason)
    if task.cancellation == "quiescent":
        messages.success(request, "The task is cancelled: nothing of it runs any more.")
    else:
        messages.success(
            request,
            "The task is being cancelled: no new work starts, and what still runs is stopped.",
        )
    return HttpResponseRedirect(f"/tasks/{task.pk}/")


@require_POST
@console_view
def task_attempt(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    """Start a new attempt from the task's page (the service checks the right and whether the
    task still admits work)."""
    reason = request.POST.get("reason", "")
    if len(reason) > 2000:
        raise InvalidInput("reason is longer than 2000 characters")
    attempt = attempts.attempt_create(actor, task_id, reason=reason)
    messages.success(
        request,
        f"Attempt #{attempt.number} started: the earlier attempt ended and new work is booked "
        "in this one, with what the budget still leaves.",
    )
    return HttpResponseRedirect(f"/tasks/{task_id}/")


def _view_query(request: HttpRequest) -> str:
    """The filters shown, as a view would keep them ("" when they show everything)."""
    try:
        return view_query("tasks", request.GET.urlencode())
    except InvalidInput:
        return ""


@require_POST
@console_view
def task_view_save(request: HttpRequest, actor: Actor) -> HttpResponse:
    """Keep the task list's filters under a name (the service checks the right and the filters)."""
    view = saved_view_save(
        actor,
        page="tasks",
        name=request.POST.get("name", ""),
        query=request.POST.get("query", ""),
    )
    messages.success(request, f"View '{view.name}' saved: it is under \"Your views\".")
    return HttpResponseRedirect(f"/tasks/?{view.query}")


@require_POST
@console_view
def task_view_remove(request: HttpRequest, actor: Actor, view_id: int) -> HttpResponse:
    saved_view_delete(actor, view_id)
    messages.success(request, "View removed.")
    return HttpResponseRedirect("/tasks/")
