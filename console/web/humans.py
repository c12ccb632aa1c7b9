"""The human side of the console: /approvals/ (operators: decide, edit, bulk, live), /waits/
(admins: renew, transform, end expired waits), and the task page's control forms. Every action
goes through the same runtime service as the REST API, which checks the right."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.api.parsers import json_problem
from console.web.views import console_view, json_text, time_left
from runtime import approvals, control, policy, waits
from runtime import events as journal
from runtime.actors import Actor
from runtime.approval_selectors import approval_list, params_diff, pending_approval_tools
from runtime.errors import DomainError, InvalidInput, NotAuthorized
from runtime.models import Operation
from runtime.text import char_hidden
from runtime.transitions import ApprovalStatus

_CODES = {
    "approval_stale": "the proposal changed since you looked (stale)",
    "approval_expired": "the request expired",
    "approval_decided": "someone already decided it",
    "not_authorized": "you may not decide it",
}


def _filters(request: HttpRequest) -> dict[str, str]:
    return {
        "tool": (request.GET.get("tool") or "").strip()[:200],
        "task": (request.GET.get("task") or "").strip()[:64],
    }


def _approval_rows(actor: Actor, filters: dict[str, str]) -> list[dict[str, Any]]:
    now = timezone.now()
    # The roles are read once for the page; each row then asks the policy's pure rule why this
    # person may not decide it (the page offers no decision the gate would refuse).
    person = policy.fresh(actor)
    rows = []
    for a in approval_list(
        actor,
        status=ApprovalStatus.PENDING,
        tool=filters["tool"] or None,
        task_id=filters["task"] or None,
        limit=200,
    ):
        amount = a.params.get("amount_cents") if isinstance(a.params, dict) else None
        rows.append(
            {
                "a": a,
                "params": json_text(a.params),
                "params_pretty": json.dumps(a.params, indent=2, sort_keys=True, ensure_ascii=False),
                "params_edit": json_for_editing(a.params),
                "diff": [
                    {**d, "before": json_text(d["before"]), "after": json_text(d["after"])}
                    for d in params_diff(a)
                ],
                "amount": f"{amount / 100:,.2f}" if isinstance(amount, int) else None,
                "left": time_left(a.expires_at, now),
                "refusal": policy.approval_decision_refusal(person, a),
            }
        )
    return rows


def json_for_editing(value: Any) -> str:
    """Pretty JSON for the edit form: a textarea shows no markup, so each hidden character
    (runtime.text) is written as its JSON escape, which reads as what it is and parses back to
    the same value."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return "".join(json.dumps(ch)[1:-1] if ch != "\n" and char_hidden(ch) else ch for ch in text)


def _approvals_context(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    filters = _filters(request)
    tools = pending_approval_tools()
    query = urlencode({k: v for k, v in filters.items() if v})
    return {
        "rows": _approval_rows(actor, filters),
        "filters": filters,
        "tools": tools,
        "can_decide": policy.allowed(policy.can_edit_approval, actor),
        "fragment_url": "/fragments/approvals" + (f"?{query}" if query else ""),
        "back": "/approvals/" + (f"?{query}" if query else ""),
        "feed_head": journal.feed_head(),
    }


@require_GET
@console_view
def approvals_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/approvals.html", _approvals_context(request, actor))


@require_GET
@console_view
def approvals_fragment(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/_approval_rows.html", _approvals_context(request, actor))


def _refuse_unstorable(request: HttpRequest) -> None:
    """A form value PostgreSQL cannot store (a NUL, a lone surrogate) is a 400 page, never a 500
    from deep inside a write."""
    problem = json_problem({k: request.POST.getlist(k) for k in request.POST})
    if problem:
        raise InvalidInput(problem)


def _back(request: HttpRequest) -> HttpResponseRedirect:
    target = request.POST.get("next") or "/approvals/"
    # Only our own pages: never an open redirect.
    if not target.startswith("/") or target.startswith("//"):
        target = "/approvals/"
    return HttpResponseRedirect(target)


@require_POST
@console_view
def approval_decide(request: HttpRequest, actor: Actor, approval_id: str) -> HttpResponse:
    _refuse_unstorable(request)
    decision = request.POST.get("decision", "")
    try:
        approval = approvals.approval_decide(
            actor,
            approval_id,
            decision=decision,
            reason=request.POST.get("reason", "")[:2000],
            params_hash=request.POST.get("params_hash", ""),
        )
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"{approval_id}: refused, {_CODES.get(exc.code, exc.message)}.")
        return _back(request)
    messages.success(request, f"{approval.pk}: {approval.status}.")
    return _back(request)


@require_POST
@console_view
def approvals_bulk(request: HttpRequest, actor: Actor) -> HttpResponse:
    _refuse_unstorable(request)
    decision = request.POST.get("decision", "")
    reason = request.POST.get("reason", "")[:2000]
    items = []
    for value in request.POST.getlist("selected")[: approvals.MAX_BULK + 1]:
        approval_id, _, digest = value.partition("|")
        items.append(approvals.BulkItem(approval_id, decision, reason, digest))
    try:
        results = approvals.approval_decide_bulk(actor, items)
    except DomainError as exc:
        messages.error(request, f"Nothing decided: {exc.message}.")
        return _back(request)
    for result in results:
        if result["status"] == 200:
            messages.success(request, f"{result['approval']}: {result['approval_status']}.")
        else:
            code = result["error"]["code"]
            messages.error(
                request,
                f"{result['approval']}: refused, {_CODES.get(code, result['error']['message'])}.",
            )
    return _back(request)


@require_POST
@console_view
def approval_edit(request: HttpRequest, actor: Actor, approval_id: str) -> HttpResponse:
    _refuse_unstorable(request)
    try:
        params = json.loads(request.POST.get("params", ""))
    except ValueError:
        messages.error(request, f"{approval_id}: the parameters are not valid JSON.")
        return _back(request)
    try:
        if not isinstance(params, dict):
            raise InvalidInput("the parameters must be a JSON object")
        problem = json_problem(params)
        if problem:
            raise InvalidInput(problem)
        new = approvals.approval_edit(
            actor, approval_id, params=params, reason=request.POST.get("reason", "")[:2000]
        )
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(
            request, f"{approval_id}: edit refused, {_CODES.get(exc.code, exc.message)}."
        )
        return _back(request)
    messages.success(
        request, f"Proposal version {new.proposal_version} ({new.pk}) now needs another approver."
    )
    return _back(request)


# --- /waits/ ------------------------------------------------------------------------------------


def _waits_context(actor: Actor) -> dict[str, Any]:
    rows = []
    for wait in waits.expired_waits_with_approvals(actor):
        op, approval = wait.operation, wait.approval
        rows.append(
            {
                "op": op,
                "kind": "approval" if approval is not None else "signal",
                "approval": approval,
                "params": json_text(op.params),
                "expired_at": approval.expires_at if approval is not None else op.wait_until,
            }
        )
    return {
        "rows": rows,
        "can_manage": policy.allowed(policy.can_manage_waits, actor),
        "feed_head": journal.feed_head(),
    }


@require_GET
@console_view
def waits_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/waits.html", _waits_context(actor))


@require_GET
@console_view
def waits_fragment(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/_wait_rows.html", _waits_context(actor))


@require_POST
@console_view
def wait_action(request: HttpRequest, actor: Actor, operation_id: str) -> HttpResponse:
    _refuse_unstorable(request)
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")[:2000]
    try:
        if action == "renew":
            try:
                seconds = int(request.POST.get("expires_in_seconds", ""))
            except ValueError:
                raise InvalidInput("the new validity must be a whole number of seconds") from None
            op: Operation = waits.wait_renew(
                actor, operation_id, expires_in_seconds=seconds, reason=reason
            )
            messages.success(request, f"{op.pk}: renewed, now {op.status}.")
        elif action == "transform":
            op = waits.wait_transform(actor, operation_id, reason=reason)
            messages.success(request, f"{op.pk}: transformed, now {op.status}.")
        elif action == "end":
            task = waits.wait_end_task(actor, operation_id, reason=reason)
            messages.success(
                request, f"Task {task.pk} ended ({task.outcome or task.cancellation})."
            )
        else:
            raise InvalidInput("unknown action")
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"{operation_id}: refused, {exc.message}.")
    return HttpResponseRedirect("/waits/")


# --- task control (pause / resume / steer) ------------------------------------------------------


@require_POST
@console_view
def task_control(request: HttpRequest, actor: Actor, task_id: str) -> HttpResponse:
    _refuse_unstorable(request)
    action = request.POST.get("action", "")
    try:
        if action == "pause":
            _, command = control.task_pause(actor, task_id, reason=request.POST.get("reason", ""))
        elif action == "resume":
            _, command = control.task_resume(actor, task_id, reason=request.POST.get("reason", ""))
        elif action == "steer":
            _, command = control.task_steer(
                actor, task_id, direction=request.POST.get("direction", "")
            )
        else:
            raise InvalidInput("unknown action")
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"Refused: {exc.message}.")
    else:
        messages.success(request, f"{command.kind} {command.pk}: {command.disposition}.")
    return HttpResponseRedirect(f"/tasks/{task_id}/")
