"""Who is working on what, on the people's queues (/approvals/ and /unresolved/): each card says
who has taken it and since when, offers Take, Hand over, Release and its comments, and the
queue is filtered by "To do" (nobody's, or mine: the default), "Mine" or "All". Every action is
a runtime.worklist service, which checks the right (runtime.policy.can_work_on); the journal
event it writes is what moves the other people's open pages (console.web.consumers)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.api.parsers import json_problem
from console.web.decorators import console_view
from runtime import policy, worklist
from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput, NotAuthorized, NotFound
from runtime.selectors.worklist import (
    VIEW_TODO,
    VIEWS,
    claim_return_after,
    claims_live,
    comments_of,
    in_view,
    people_for,
)

_PAGES = {"approvals": "/approvals/", "unresolved": "/unresolved/"}


def presence_place(actor: Actor, queue: str) -> str:
    """The queue whose presence the page shows ("Also here", runtime.presence), or "" for one
    who does not work it: they are neither recorded nor told who is there."""
    return queue if policy.allowed(policy.can_work_on, actor, queue) else ""


def view_of(request: HttpRequest) -> str:
    """The view asked for ("todo" when none); InvalidInput for one that does not exist."""
    view = (request.GET.get("view") or VIEW_TODO).strip()
    if view not in VIEWS:
        raise InvalidInput("“view” is one of " + ", ".join(f"{k} ({v})" for k, v in VIEWS.items()))
    return view


def worked_rows(
    actor: Actor,
    queue: str,
    rows: list[dict[str, Any]],
    operation_of: Callable[[dict[str, Any]], str],
    view: str,
    query: dict[str, str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows in ``view``, each with its ``work`` (holder, comments, what the person may do),
    and the views' tabs with their counts. ``query``: the page's other filters, kept by the
    tabs' links."""
    now = timezone.now()
    ids = [operation_of(row) for row in rows]
    claims = claims_live(queue, ids, now)
    comments = comments_of(ids)
    can_work = policy.allowed(policy.can_work_on, actor, queue)
    people = people_for(queue) if can_work else []
    shown = []
    counts = dict.fromkeys(VIEWS, 0)
    for row, op_id in zip(rows, ids, strict=True):
        claim = claims.get(op_id)
        for name in VIEWS:
            counts[name] += in_view(name, claim, actor)
        if not in_view(view, claim, actor):
            continue
        mine = claim is not None and claim.holder_id == actor.user_id
        row["work"] = {
            "queue": queue,
            "op": op_id,
            "claim": claim,
            "mine": mine,
            "returns_at": _returns_at(claim.taken_at) if claim else None,
            "comments": comments[op_id],
            "can_work": can_work,
            # Handing over is the holder's, or anyone's while nobody holds it.
            "can_give": can_work and (claim is None or mine),
            "people": [name for pk, name in people if pk != actor.user_id],
        }
        shown.append(row)
    tabs = [
        {
            "key": name,
            "label": label,
            "count": counts[name],
            "url": "?" + urlencode({**query, "view": name}),
            "current": name == view,
        }
        for name, label in VIEWS.items()
    ]
    return shown, tabs


def _returns_at(taken_at: datetime) -> datetime:
    return taken_at + claim_return_after()


def _back(request: HttpRequest, queue: str) -> HttpResponseRedirect:
    target = request.POST.get("next") or _PAGES.get(queue, "/")
    # Only our own pages: never an open redirect.
    if not target.startswith("/") or target.startswith("//"):
        target = _PAGES.get(queue, "/")
    return HttpResponseRedirect(target)


def _act(actor: Actor, queue: str, operation_id: str, request: HttpRequest) -> str:
    """Run the asked action; the sentence that tells the person what happened."""
    action = request.POST.get("action", "")
    if action == "take":
        worklist.claim_take(actor, queue, operation_id)
        return f"{operation_id} is yours: it left the others' “to do”."
    if action == "give":
        to = request.POST.get("to", "").strip()
        if not to:
            raise InvalidInput("choose the person to hand it to")
        worklist.claim_give(actor, queue, operation_id, to=to)
        return f"{operation_id} is now {to}'s."
    if action == "release":
        worklist.claim_release(actor, queue, operation_id)
        return f"{operation_id} is back in everyone's “to do”."
    if action == "comment":
        worklist.comment_add(actor, queue, operation_id, text=request.POST.get("text", ""))
        return f"Your comment on {operation_id} is saved."
    raise AssertionError(action)  # work_action let only the four actions through


@require_POST
@console_view
def work_action(request: HttpRequest, actor: Actor, queue: str, operation_id: str) -> HttpResponse:
    """Take, hand over, release or comment (``action``) on an item of ``queue``. Without the
    right: 403; an unknown queue, action or an unstorable value: 400; an item not seen: 404;
    otherwise back to the page with what happened (or why nothing did: someone else holds it,
    it was settled meanwhile)."""
    problem = json_problem({k: request.POST.getlist(k) for k in request.POST})
    if problem:
        raise InvalidInput(problem)
    if queue not in _PAGES:
        raise InvalidInput("the queue is approvals or unresolved")
    if request.POST.get("action") not in ("take", "give", "release", "comment"):
        raise InvalidInput("action is take, give, release or comment")
    try:
        done = _act(actor, queue, operation_id, request)
    except (NotAuthorized, NotFound):
        raise  # a 403 or 404 page: the right or the item is missing, not the moment
    except DomainError as exc:
        messages.error(request, f"Nothing was changed on {operation_id}: {exc.message}.")
        return _back(request, queue)
    messages.success(request, done)
    return _back(request, queue)
