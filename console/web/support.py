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
from runtime import policy, resolutions
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput, NotAuthorized
from runtime.models import Operation
from runtime.rules.statuses import OperationStatus
from runtime.selectors.operations import invocations_by_operation
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


def _context(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    view = worklist.view_of(request)
    rows, tabs = worklist.worked_rows(
        actor, "unresolved", _rows(actor), lambda row: row["op"].pk, view, {}
    )
    query = f"?view={view}"
    return {
        "rows": rows,
        "tabs": tabs,
        "fragment_url": "/fragments/unresolved" + query,
        "back": "/unresolved/" + query,
        "can_resolve": policy.allowed(policy.can_resolve, actor),
        "feed_head": journal.feed_head(),
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
