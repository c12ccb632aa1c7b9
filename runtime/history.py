"""Histories (decided approvals, resolutions): one filter and one keyset page, so each history
only names its columns. Bottom layer: Django's query expressions, nothing of the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet


@dataclass(frozen=True)
class HistoryFilter:
    """What a person narrows a history by: a tool, a task, a part of the person's name, and a
    time range (``since`` inclusive, ``until`` exclusive). Empty fields filter nothing."""

    tool: str | None = None
    task_id: str | None = None
    person: str | None = None
    since: datetime | None = None
    until: datetime | None = None


NO_FILTER = HistoryFilter()


@dataclass(frozen=True)
class HistoryColumns:
    """The lookups a history's rows are filtered and ordered on."""

    at: str
    tool: str
    task: str
    person: str


def history_page(
    qs: QuerySet[Any],
    columns: HistoryColumns,
    filters: HistoryFilter,
    *,
    before: tuple[datetime, Any] | None,
    limit: int,
) -> list[Any]:
    """One keyset page of ``qs``, the latest first: ``before`` is the (time, id) of the previous
    page's last row. Pure query building; the caller scoped ``qs`` to what its actor may see."""
    if filters.tool:
        qs = qs.filter(**{columns.tool: filters.tool})
    if filters.task_id:
        qs = qs.filter(**{columns.task: filters.task_id})
    if filters.person:
        qs = qs.filter(**{f"{columns.person}__icontains": filters.person})
    if filters.since is not None:
        qs = qs.filter(**{f"{columns.at}__gte": filters.since})
    if filters.until is not None:
        qs = qs.filter(**{f"{columns.at}__lt": filters.until})
    if before is not None:
        at, pk = before
        qs = qs.filter(Q(**{f"{columns.at}__lt": at}) | Q(**{columns.at: at, "id__lt": pk}))
    return list(qs.order_by(f"-{columns.at}", "-id")[:limit])
