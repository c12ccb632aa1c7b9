"""The support queue (/unresolved/): operations whose outcome no machine could establish, with
their evidence, and the resolutions their receiver's contract allows; and work a machine stopped
for a person (manual intervention), with why, to requeue or abandon."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from console.web import history, worklist
from console.web.views import console_view, json_text
from runtime import events as journal
from runtime import policy, resolution_bulk, resolutions
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput, NotAuthorized
from runtime.models import Operation
from runtime.rules.statuses import OperationStatus
from runtime.selectors.operations import invocations_by_operation
from runtime.selectors.unresolved_groups import similar_groups
from runtime.stoprule import unconfirmed_calls_txn
from runtime.tools import contract_of

_LABELS = {
    "succeeded": "Mark succeeded",
    "no_effect": "Mark no effect",
    "retry_same_key": "Retry with the same key",
    "lookup": "Look up at the receiver",
    "compensate": "Compensate",
    "requeue": "Requeue",
    "abandon": "Abandon",
}


# What each resolution does, asked before it is taken (static/console.js: data-confirm).
_CONFIRMS = {
    "succeeded": "Mark operation {id} ({tool}) as succeeded? The task carries on as if the "
    "effect happened.",
    "no_effect": "Mark operation {id} ({tool}) as having had no effect? It counts as failed.",
    "retry_same_key": "Retry operation {id} ({tool}) under the same idempotency key? The "
    "receiver is called again.",
    "lookup": "Ask the receiver what became of operation {id} ({tool})? Its answer settles it.",
    "compensate": "Compensate operation {id} ({tool})? Its compensating tool runs to undo the "
    "effect.",
    "requeue": "Requeue operation {id} ({tool}) under the same idempotency key? It runs again.",
    "abandon": "Abandon operation {id} ({tool}) with the reason you gave? It ends failed (or "
    "comes back here as unresolved if a call of it may have had an effect).",
}
# How an operation stands after its resolution, in words.
_NOW = {
    "succeeded": "now succeeded",
    "failed": "now failed, with no effect",
    "pending": "queued to run again",
    "compensating": "being compensated",
    "unresolved": "now unresolved: a call of it may have had an effect, settle it below",
}


def _now(resolution: str, status: str) -> str:
    if resolution == "abandon" and status == OperationStatus.FAILED:
        return "now failed, abandoned"
    return _NOW.get(status, "now " + status)


def _confirm(resolution: str, op: Operation) -> str:
    asked = _CONFIRMS.get(resolution, "Resolve operation {id} ({tool})?")
    return asked.format(id=op.pk, tool=op.tool or op.kind) + " This cannot be undone."


def _rows(actor: Actor) -> list[dict[str, Any]]:
    rows = []
    queue = resolutions.unresolved_queue(actor)
    invocations = invocations_by_operation([op.pk for op in queue])
    history = resolutions.resolutions_by_operation([op.pk for op in queue])
    stopped = [op.pk for op in queue if op.status == OperationStatus.MANUAL_INTERVENTION]
    unconfirmed = unconfirmed_calls_txn(stopped)
    for op in queue:
        allowed = resolutions.resolutions_allowed(op, unconfirmed=op.pk in unconfirmed)
        intervention = op.status == OperationStatus.MANUAL_INTERVENTION
        rows.append(
            {
                "op": op,
                "contract": contract_of(op.tool),
                "intervention": intervention,
                "cause": resolutions.intervention_cause(op) if intervention else None,
                "actions": [(a, _LABELS[a], _confirm(a, op)) for a in allowed],
                "params": json_text(op.params),
                "invocations": [
                    {"inv": inv, "receipt": None if inv.receipt is None else json_text(inv.receipt)}
                    for inv in invocations[op.pk]
                ],
                "history": history[op.pk],
            }
        )
    return rows


def _groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups of similar unresolved operations among the rows shown, each with the
    resolutions every member allows (the same tool: the same contract, save a compensation)."""
    actions = {row["op"].pk: row["actions"] for row in rows}
    found = []
    for group in similar_groups([row["op"] for row in rows]):
        ids = [op.pk for op in group.operations]
        common = [a for a in actions[ids[0]] if all(a[0] in _values(actions[i]) for i in ids)]
        n, tool = len(ids), group.tool or "the tool"
        found.append(
            {
                "group": group,
                "actions": [
                    (value, label, _BULK_CONFIRM.format(n=n, tool=tool, label=label.lower()))
                    for value, label, _ in common
                ],
            }
        )
    return found


def _values(actions: list[tuple[str, str, str]]) -> set[str]:
    return {value for value, _, _ in actions}


_BULK_CONFIRM = (
    "{label}: each selected {tool} operation of this group ({n} alike)? Your evidence is "
    "recorded for each. This cannot be undone."
)


def _context(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    view = worklist.view_of(request)
    rows, tabs = worklist.worked_rows(
        actor, "unresolved", _rows(actor), lambda row: row["op"].pk, view, {}
    )
    query = f"?view={view}"
    return {
        "rows": rows,
        "groups": _groups(rows),
        "tabs": tabs,
        "fragment_url": "/fragments/unresolved" + query,
        "back": "/unresolved/" + query,
        "can_resolve": policy.allowed(policy.can_resolve, actor),
        "feed_head": journal.feed_head(),
        "presence": worklist.presence_place(actor, "unresolved"),
    }


@require_GET
@console_view
def unresolved(request: HttpRequest, actor: Actor) -> HttpResponse:
    status = request.GET.get("status", "unresolved")
    if status == "resolved":
        return history.resolution_history_page(request, actor)
    if status != "unresolved":
        raise InvalidInput("status is unresolved (the queue) or resolved (its history)")
    return render(request, "console/unresolved.html", _context(request, actor))


@require_GET
@console_view
def unresolved_fragment(request: HttpRequest, actor: Actor) -> HttpResponse:
    return render(request, "console/_unresolved_rows.html", _context(request, actor))


@require_POST
@console_view
def resolve(request: HttpRequest, actor: Actor, operation_id: str) -> HttpResponse:
    try:
        version = int(request.POST.get("state_version", ""))
    except ValueError:
        raise InvalidInput("state_version is missing") from None
    resolution = request.POST.get("resolution", "")
    try:
        op: Operation = resolutions.operation_resolve(
            actor,
            operation_id,
            resolution=resolution,
            # A textarea sends its line breaks as CRLF: kept as the person wrote them (LF).
            evidence=request.POST.get("evidence", "").replace("\r\n", "\n"),
            state_version=version,
        )
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        if exc.code == "state_version_mismatch":
            messages.error(request, "Someone else changed this operation first; nothing was done.")
        else:
            messages.error(request, f"Nothing was done to {operation_id}: {exc.message}.")
        return HttpResponseRedirect("/unresolved/")
    messages.success(
        request,
        f"Resolved operation {op.pk} ({_LABELS.get(resolution, resolution).lower()}): "
        f"it is {_now(resolution, op.status)}.",
    )
    return HttpResponseRedirect("/unresolved/")


@require_POST
@console_view
def resolve_bulk(request: HttpRequest, actor: Actor) -> HttpResponse:
    """Settle the selected operations of a group of similar ones, each with the same resolution
    and evidence (runtime.resolution_bulk): 403 without the right, a message per operation."""
    items = []
    for value in request.POST.getlist("selected")[: resolution_bulk.MAX_BULK + 1]:
        op_id, _, version = value.partition("|")
        try:
            items.append(resolution_bulk.BulkItem(op_id, int(version)))
        except ValueError:
            raise InvalidInput("each selected operation carries its state version") from None
    resolution = request.POST.get("resolution", "")
    try:
        results = resolution_bulk.operations_resolve_bulk(
            actor,
            items,
            resolution=resolution,
            evidence=request.POST.get("evidence", "").replace("\r\n", "\n"),
        )
    except NotAuthorized:
        raise  # a 403 page, not a message: the right is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"Nothing was settled: {exc.message}.")
        return HttpResponseRedirect("/unresolved/")
    label = _LABELS.get(resolution, resolution).lower()
    for r in results:
        if r["ok"]:
            messages.success(
                request,
                f"Resolved {r['operation']} ({label}): it is {_now(resolution, r['status'])}.",
            )
        else:
            messages.error(request, f"Nothing was done to {r['operation']}: {r['message']}.")
    return HttpResponseRedirect("/unresolved/")
