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
from console.templatetags.visible import visible
from console.web import history, worklist
from console.web.formats import currency_of, money, waited, what_runs
from console.web.views import console_view, json_text, time_left
from runtime import approvals, control, policy, waits
from runtime import events as journal
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput, NotAuthorized
from runtime.models import Approval, Operation
from runtime.rules.statuses import ApprovalStatus
from runtime.selectors.approvals import (
    approval_list,
    approval_voters,
    approved_by,
    params_diff,
    pending_approval_tools,
)
from runtime.selectors.waits import expired_waits_with_approvals
from runtime.selectors.worklist import VIEW_TODO, VIEWS
from runtime.text import char_hidden
from runtime.tools.base import Contract, contract_of

# Why a decision was not taken, in the words of the sentence "Nothing was decided on X: ...".
_CODES = {
    "approval_stale": "its parameters changed since you looked (stale); read them again",
    "approval_expired": "it expired first; an admin can renew it on the Waits page",
    "approval_decided": "someone else decided it first",
    "not_authorized": "you may not decide it",
}
_DECIDED = {
    ApprovalStatus.APPROVED: "Request {id} is approved: its action runs now.",
    ApprovalStatus.RELEASED: "Request {id} is approved: its action runs now.",
    ApprovalStatus.DENIED: "Request {id} is denied: its action will not run.",
}


# The inbox's orders (runtime.selectors.approvals.APPROVAL_SORTS), as the page names them; the
# first is the default: the request about to expire comes first.
SORTS = {
    "expiry": "soonest expiring first",
    "oldest": "waiting longest first",
    "newest": "newest first",
    "tool": "by tool",
}
DEFAULT_SORT = "expiry"


def _filters(request: HttpRequest) -> dict[str, str]:
    return {
        "tool": (request.GET.get("tool") or "").strip()[:200],
        "task": (request.GET.get("task") or "").strip()[:64],
        "sort": (request.GET.get("sort") or "").strip()[:20],
        "view": (request.GET.get("view") or "").strip()[:20],
    }


def _problems(request: HttpRequest, filters: dict[str, str]) -> list[str]:
    """What the inbox cannot read in its query, as sentences (the page lists nothing then)."""
    problems = []
    if request.GET.get("status", "pending") not in ("pending", "decided"):
        problems.append("“status” is pending (waiting requests) or decided (the history).")
    if filters["view"] and filters["view"] not in VIEWS:
        problems.append("“view” is one of " + ", ".join(f"{k} ({v})" for k, v in VIEWS.items()))
    if filters["sort"] and filters["sort"] not in SORTS:
        problems.append(
            "“sort” is one of " + ", ".join(f"{k} ({v})" for k, v in SORTS.items()) + "."
        )
    return problems


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
        sort=filters["sort"] or DEFAULT_SORT,
        limit=200,
    ):
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
                "amount": money(a.params),
                "left": time_left(a.expires_at, now),
                "waited": waited(a.created_at, now),
                "refusal": policy.approval_decision_refusal(person, a),
                **_votes_words(actor, a),
                **_release_words(a),
            }
        )
    return rows


def _votes_words(actor: Actor, a: Approval) -> dict[str, Any]:
    """The two-person rule on the card: who approved so far (by name) and whether this person
    is one of them (their Approve is then disabled: a second approve would not count)."""
    votes = approval_voters(a)
    return {
        "approved_by": [v.approver.partition(":")[2] or v.approver for v in votes],
        "voted": any(v.approver_key == actor.key for v in votes),
    }


def _release_words(a: Approval) -> dict[str, Any]:
    """What approving releases, for a tool with effects outside the console (any contract but
    pure): the Approve button's question (the amount, the tool and its key parameters) and the
    line "Approve selected" lists for it. A pure tool's approval asks nothing."""
    if contract_of(a.tool) == Contract.PURE:
        return {"effects": False}
    amount = money(a.params)
    what = visible(what_runs(a.tool, a.params), "text")
    cents = a.params.get("amount_cents") if isinstance(a.params, dict) else None
    votes = len(approval_voters(a)) + 1
    runs = (
        "It runs at once and cannot be undone."
        if votes >= a.approvals_required
        else f"Yours is approval {votes} of {a.approvals_required}: it runs once "
        f"{a.approvals_required} people approved."
    )
    return {
        "effects": True,
        "approve_question": (
            f"Approve request {a.pk}"
            + (f" and release {amount}" if amount and votes >= a.approvals_required else "")
            + f"? What will run: {what}. {runs}"
        ),
        "release_line": f"{a.pk}: {what}"
        + (f", {amount}" if amount else "")
        + (
            f" (approval {votes} of {a.approvals_required}: it does not run yet)"
            if votes < a.approvals_required
            else ""
        ),
        "cents": cents if amount else None,
        "currency": currency_of(a.params),
    }


def _expired_rows(actor: Actor, filters: dict[str, str]) -> list[dict[str, Any]]:
    """Approval requests that expired undecided and still wait for an admin (renew, transform
    or end on /waits/): kept in sight on the inbox instead of vanishing."""
    rows = []
    for wait in expired_waits_with_approvals(actor):
        approval = wait.approval
        if approval is None:
            continue
        if filters["tool"] and approval.tool != filters["tool"]:
            continue
        if filters["task"] and approval.task_id != filters["task"]:
            continue
        rows.append({"a": approval, "op": wait.operation, "amount": money(approval.params)})
    return rows


def json_for_editing(value: Any) -> str:
    """Pretty JSON for the edit form: a textarea shows no markup, so each hidden character
    (runtime.text) is written as its JSON escape, which reads as what it is and parses back to
    the same value."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return "".join(json.dumps(ch)[1:-1] if ch != "\n" and char_hidden(ch) else ch for ch in text)


def _approvals_context(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    filters = _filters(request)
    problems = _problems(request, filters)
    tools = pending_approval_tools()
    query = urlencode({k: v for k, v in filters.items() if v})
    rows: list[dict[str, Any]] = []
    tabs: list[dict[str, Any]] = []
    if not problems:
        rows, tabs = worklist.worked_rows(
            actor,
            "approvals",
            _approval_rows(actor, filters),
            lambda row: row["a"].operation_id,
            filters["view"] or VIEW_TODO,
            {k: v for k, v in filters.items() if v and k != "view"},
        )
    return {
        "rows": rows,
        "tabs": tabs,
        "expired": [] if problems else _expired_rows(actor, filters),
        "problems": problems,
        "sorts": SORTS,
        "sort": filters["sort"] or DEFAULT_SORT,
        "can_manage_waits": policy.allowed(policy.can_manage_waits, actor),
        "filters": filters,
        "tools": tools,
        "can_decide": policy.allowed(policy.can_edit_approval, actor),
        "fragment_url": "/fragments/approvals" + (f"?{query}" if query else ""),
        "back": "/approvals/" + (f"?{query}" if query else ""),
        "feed_head": journal.feed_head(),
        "presence": worklist.presence_place(actor, "approvals"),
    }


@require_GET
@console_view
def approvals_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    if request.GET.get("status") == "decided":
        return history.approval_history_page(request, actor)
    context = _approvals_context(request, actor)
    status = 400 if context["problems"] else 200
    return render(request, "console/approvals.html", context, status=status)


@require_GET
@console_view
def approvals_fragment(request: HttpRequest, actor: Actor) -> HttpResponse:
    context = _approvals_context(request, actor)
    status = 400 if context["problems"] else 200
    return render(request, "console/_approval_rows.html", context, status=status)


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
        messages.error(request, _not_decided(approval_id, exc.code, exc.message))
        return _back(request)
    messages.success(
        request,
        _decided(approval.pk, approval.status, approved_by(approval), approval.approvals_required),
    )
    return _back(request)


def _decided(approval_id: str, status: str, voters: list[str], required: int) -> str:
    if status == ApprovalStatus.PENDING:
        # An approve that is not the last one the two-person rule requires.
        return (
            f"Your approval of {approval_id} is recorded ({len(voters)} of {required}): it "
            "waits for another approver before its action runs."
        )
    return _DECIDED.get(status, "Request {id} is now " + status + ".").format(id=approval_id)


def _not_decided(approval_id: str, code: str, message: str) -> str:
    return f"Nothing was decided on {approval_id}: {_CODES.get(code, message)}."


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
    if not items:
        messages.error(request, "Tick at least one request first: nothing was decided.")
        return _back(request)
    if len(items) > approvals.MAX_BULK:
        messages.error(
            request,
            f"Select at most {approvals.MAX_BULK} requests at a time: nothing was decided.",
        )
        return _back(request)
    try:
        results = approvals.approval_decide_bulk(actor, items)
    except DomainError as exc:
        messages.error(request, f"Nothing was decided: {exc.message}.")
        return _back(request)
    for result in results:
        if result["status"] == 200:
            messages.success(
                request,
                _decided(
                    result["approval"],
                    result["approval_status"],
                    result["approved_by"],
                    result["approvals_required"],
                ),
            )
        else:
            error = result["error"]
            messages.error(
                request, _not_decided(result["approval"], error["code"], error["message"])
            )
    return _back(request)


@require_POST
@console_view
def approval_edit(request: HttpRequest, actor: Actor, approval_id: str) -> HttpResponse:
    _refuse_unstorable(request)
    try:
        params = json.loads(request.POST.get("params", ""))
    except ValueError:
        messages.error(
            request, f"Your edit of {approval_id} was not saved: the parameters are not valid JSON."
        )
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
            request,
            f"Your edit of {approval_id} was not saved: {_CODES.get(exc.code, exc.message)}.",
        )
        return _back(request)
    messages.success(
        request,
        f"Saved. Proposal version {new.proposal_version} ({new.pk}) now waits for another "
        "operator: the editor of a proposal may not approve it.",
    )
    return _back(request)


# --- /waits/ ------------------------------------------------------------------------------------


def _waits_context(actor: Actor) -> dict[str, Any]:
    rows = []
    for wait in expired_waits_with_approvals(actor):
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
            messages.success(request, _renewed(op))
        elif action == "transform":
            op = waits.wait_transform(actor, operation_id, reason=reason)
            messages.success(
                request,
                f"Operation {op.pk} is cancelled"
                + (", its request denied" if op.approval_required else "")
                + ": it will not run, and its agent is told so.",
            )
        elif action == "end":
            task = waits.wait_end_task(actor, operation_id, reason=reason)
            messages.success(
                request,
                f"Task {task.pk} has ended ({task.outcome})."
                if task.outcome
                else f"Task {task.pk} is being stopped: no new work starts.",
            )
        else:
            raise InvalidInput("unknown action")
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"Nothing was done to {operation_id}: {exc.message}.")
    return HttpResponseRedirect("/waits/")


def _renewed(op: Operation) -> str:
    if op.status == "waiting_approval":
        return f"Renewed {op.pk}: it waits for an operator's decision again, on Approvals."
    return f"Renewed {op.pk}: it waits for its signal again."


# --- task control (pause / resume / steer) ------------------------------------------------------

_COMMANDED = {
    ("pause", "applied"): "Paused: the task starts no new work until it is resumed.",
    ("pause", "no_change"): "The task was already paused; nothing changed.",
    ("resume", "applied"): "Resumed: the task goes on.",
    ("resume", "no_change"): "The task was not paused; nothing changed.",
    ("steer", "applied"): "Direction sent: the agent reads it with its next step.",
    ("steer", "no_change"): "The agent already had that direction; nothing changed.",
}


def _commanded(kind: str, disposition: str, detail: str) -> str:
    if disposition == "refused":
        return f"Nothing was done ({kind}): {detail or 'refused'}."
    return _COMMANDED.get((kind, disposition), f"{kind}: {disposition}.")


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
        messages.error(request, f"Nothing was done: {exc.message}.")
    else:
        messages.add_message(
            request,
            messages.ERROR if command.disposition == "refused" else messages.SUCCESS,
            _commanded(command.kind, command.disposition, command.detail),
        )
    return HttpResponseRedirect(f"/tasks/{task_id}/")
