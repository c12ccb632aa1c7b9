"""An operation's own page (/operations/<id>/): its step, tool and parameters, its status
history from the journal, invocations by lease generation, approvals, resolutions and budget
holds. (The tool catalogue's page, /tools/, is console.web.tool_pages.)"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.web.decorators import console_view
from runtime.actors import Actor
from runtime.selectors.approvals import approved_by
from runtime.selectors.operations import STORY_ROWS, operation_story, story_transitions
from runtime.tools import contract_of


def pretty(value: Any) -> str:
    """JSON as people read it, on several lines; shown through the ``visible`` filter."""
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, default=str)


@require_GET
@console_view
def operation_detail(request: HttpRequest, actor: Actor, operation_id: str) -> HttpResponse:
    story = operation_story(actor, operation_id)
    op = story.op
    return render(
        request,
        "console/operation_detail.html",
        {
            "op": op,
            "task": op.task,
            "contract": contract_of(op.tool) if op.tool else "",
            "params": pretty(op.params),
            "result": None if op.result is None else pretty(op.result),
            "error": None if op.error is None else pretty(op.error),
            "transitions": story_transitions(story.events),
            "events": story.events,
            "invocations": [
                {"inv": inv, "receipt": None if inv.receipt is None else pretty(inv.receipt)}
                for inv in story.invocations
            ],
            "leases": story.leases,
            "approvals": [
                {"a": a, "params": pretty(a.params), "approved_by": approved_by(a)}
                for a in story.approvals
            ],
            "resolutions": story.resolutions,
            "holds": story.holds,
            "rejections": [{"r": r, "detail": pretty(r.detail)} for r in story.rejections],
            "compensations": story.compensations,
            "cut_at": STORY_ROWS,
        },
    )
