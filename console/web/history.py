"""The queues' histories (issue 24 point 4): ``/approvals/?status=decided`` lists decided
requests with who decided, when and why; ``/unresolved/?status=resolved`` lists people's
resolutions with their evidence. Both filter by tool, task, person and time through GET
parameters, page by keyset (``before``), and answer a filter they cannot read with a clear
message on the page (400, nothing listed), never a 500. Whoever sees a live queue sees its
history, within the tasks they may see (``runtime.policy.task_scope``, in the selectors)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.dateparse import parse_date, parse_datetime

from console.api.serializers import cursor_decode, cursor_encode
from console.web.formats import money, waited
from runtime.actors import Actor
from runtime.errors import InvalidInput
from runtime.history import HistoryFilter
from runtime.rules.statuses import ApprovalStatus
from runtime.selectors.approvals import approval_history, approved_by
from runtime.selectors.operations import resolution_history
from runtime.tools.base import tool_catalogue

PAGE_SIZE = 50
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")
# The forms said on the page, no more (Python's ISO parser also takes "2026-W49-5", "20261204"
# and an hour alone, whose "until" would not mean what it says).
_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?"
)
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TIME_HINT = "write it as 2026-12-04 or 2026-12-04T14:05 (UTC)"

# A decided request's outcome, in words.
_DECISIONS = {
    ApprovalStatus.APPROVED: "approved",
    ApprovalStatus.RELEASED: "approved, released to run",
    ApprovalStatus.DENIED: "denied",
    ApprovalStatus.EXPIRED: "expired undecided",
}
# A resolution, in the words of "<person> ... operation X".
_RESOLVED = {
    "succeeded": "marked succeeded",
    "no_effect": "marked as having had no effect",
    "retry_same_key": "retried under the same key",
    "lookup": "looked up at the receiver",
    "compensate": "compensated",
}


@dataclass
class HistoryQuery:
    """A history page's filters as typed (to show them back) and as read (to query with)."""

    status: str
    tool: str = ""
    task: str = ""
    person: str = ""
    since_text: str = ""
    until_text: str = ""
    since: datetime | None = None
    until: datetime | None = None  # exclusive: the end of the day or minute typed
    cursor: str = ""
    problems: list[str] = field(default_factory=list)

    def filters(self) -> HistoryFilter:
        """The filters as read, for the history selectors."""
        return HistoryFilter(
            tool=self.tool or None,
            task_id=self.task or None,
            person=self.person or None,
            since=self.since,
            until=self.until,
        )

    def query(self, **extra: str) -> str:
        """The filters as a query string (empty ones left out), with ``extra`` added."""
        pairs = {
            "status": self.status,
            "tool": self.tool,
            "task": self.task,
            "person": self.person,
            "since": self.since_text,
            "until": self.until_text,
            **extra,
        }
        return urlencode({k: v for k, v in pairs.items() if v})


def parse_when(text: str, *, end: bool) -> datetime:
    """A filter's time: a date (its start, or for an ``end`` bound the next day's start) or a
    date and time (UTC unless it names its zone; an ``end`` given to the minute includes that
    minute). ValueError when it is neither, or out of range."""
    if _DATE_ONLY.fullmatch(text):
        day = parse_date(text)  # ValueError for a day that does not exist (2026-02-30)
        if day is None:
            raise ValueError(text)
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return start + timedelta(days=1) if end else start
    if not _DATE_TIME.fullmatch(text):
        raise ValueError(text)
    value = parse_datetime(text.replace(" ", "T", 1))
    if value is None:
        raise ValueError(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if end and value.second == 0 and value.microsecond == 0:
        value += timedelta(minutes=1)
    return value


def _text(request: HttpRequest, name: str, limit: int, problems: list[str]) -> str:
    value = (request.GET.get(name) or "").strip()
    if len(value) > limit or not value.isprintable():
        problems.append(
            f"“{name}” is too long or holds control characters ({limit} characters at most)."
        )
        return ""
    return value


def history_query(request: HttpRequest, status: str) -> HistoryQuery:
    """Reads the filters of a history page; what cannot be read is a sentence in ``problems``."""
    problems: list[str] = []
    q = HistoryQuery(
        status=status,
        tool=_text(request, "tool", 200, problems),
        person=_text(request, "person", 200, problems),
        problems=problems,
    )
    task = (request.GET.get("task") or "").strip()
    if task and not _TASK_ID.fullmatch(task):
        problems.append("“task” is not a task id (letters, digits, _ and -, such as tsk_01J…).")
    else:
        q.task = task
    for name, end in (("since", False), ("until", True)):
        text = (request.GET.get(name) or "").strip()[:64]
        if not text:
            continue
        try:
            when = parse_when(text, end=end)
        except (ValueError, OverflowError):
            problems.append(f"“{name}” is not a date or a time: {_TIME_HINT}.")
            setattr(q, f"{name}_text", text if text.isprintable() else "")
            continue
        setattr(q, f"{name}_text", text)
        setattr(q, name, when)
    if q.since is not None and q.until is not None and q.since >= q.until:
        problems.append("“since” is not before “until”: nothing can match.")
    q.cursor = (request.GET.get("before") or "")[:200]
    return q


def _before(q: HistoryQuery) -> tuple[datetime, str] | None:
    if not q.cursor:
        return None
    try:
        return cursor_decode(q.cursor)
    except InvalidInput:
        q.problems.append("The page link is damaged: start again from the newest.")
        return None


def _page(request: HttpRequest, rows: list[Any], q: HistoryQuery, at: Any) -> dict[str, Any]:
    """The keyset page's links: "Older" after the last row shown, "Newest" back to the top."""
    page = rows[:PAGE_SIZE]
    older = None
    if len(rows) > PAGE_SIZE:
        last = page[-1]
        older = f"{request.path}?{q.query(before=cursor_encode(at(last), str(last.pk)))}"
    return {"older": older, "newest": f"{request.path}?{q.query()}" if q.cursor else None}


def _render(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    return render(request, template, context, status=400 if context["q"].problems else 200)


def approval_history_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    """``/approvals/?status=decided``."""
    q = history_query(request, "decided")
    before = _before(q)
    rows: list[Any] = []
    if not q.problems:
        rows = approval_history(actor, q.filters(), before=before, limit=PAGE_SIZE + 1)
    return _render(
        request,
        "console/approval_history.html",
        {
            "q": q,
            "rows": [_decided_row(a) for a in rows[:PAGE_SIZE]],
            "tools": [t["name"] for t in tool_catalogue()],
            **_page(request, rows, q, lambda a: a.decided),
        },
    )


def _decided_row(a: Any) -> dict[str, Any]:
    if a.approvals_required > 1 and a.status != ApprovalStatus.DENIED and approved_by(a):
        by = ", ".join(approved_by(a))  # the two-person rule: every approver, the first first
    elif a.decided_by:
        by = a.decided_by
    elif a.status == ApprovalStatus.EXPIRED:
        by = "nobody, in time"
    else:
        by = "the console"  # closed by the sweep: its operation had ended first
    superseded = a.status == ApprovalStatus.DENIED and a.reason == "superseded"
    return {
        "a": a,
        "decision": "superseded by an edit" if superseded else _DECISIONS.get(a.status, a.status),
        "by": by,
        "amount": money(a.params),
        "after": waited(a.created_at, a.decided),
    }


def resolution_history_page(request: HttpRequest, actor: Actor) -> HttpResponse:
    """``/unresolved/?status=resolved``."""
    q = history_query(request, "resolved")
    before = _before(q)
    keyed: tuple[datetime, int] | None = None
    if before is not None:
        try:
            keyed = (before[0], int(before[1]))
        except ValueError:
            q.problems.append("The page link is damaged: start again from the newest.")
    rows: list[Any] = []
    if not q.problems:
        rows = resolution_history(actor, q.filters(), before=keyed, limit=PAGE_SIZE + 1)
    return _render(
        request,
        "console/resolution_history.html",
        {
            "q": q,
            "rows": [
                {"r": r, "done": _RESOLVED.get(r.resolution, r.resolution)}
                for r in rows[:PAGE_SIZE]
            ],
            "tools": [t["name"] for t in tool_catalogue()],
            **_page(request, rows, q, lambda r: r.at),
        },
    )
