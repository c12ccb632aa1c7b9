"""Reads of budgets (selectors): a task's meters as a view, and the live tasks nearest to a
limit."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import ExpressionWrapper, F, FloatField

from runtime.models import BudgetMeter, Task


@dataclass(frozen=True)
class MeterView:
    name: str
    limit: int
    reserved: int
    posted: int
    unknown: int
    reserve: int

    @property
    def available(self) -> int:
        """What ordinary work can still reserve (the cleanup reserve is not available to it)."""
        return max(0, self.limit - self.reserve - self.reserved - self.posted - self.unknown)

    @property
    def used_fraction(self) -> float:
        if self.limit <= 0:
            return 1.0
        return min(1.0, (self.reserved + self.posted + self.unknown) / self.limit)

    def as_dict(self) -> dict[str, int]:
        return {
            "limit": self.limit,
            "reserved": self.reserved,
            "posted": self.posted,
            "unknown": self.unknown,
            "available": self.available,
            "reserve": self.reserve,
        }


def budget_meters(task: Task, attempt_id: str | None = None) -> list[MeterView]:
    """The meters of the task's current attempt (or the one named), by name."""
    rows = BudgetMeter.objects.filter(
        task=task, attempt_id=attempt_id or task.current_attempt_id
    ).order_by("meter")
    return [MeterView(m.meter, m.limit, m.reserved, m.posted, m.unknown, m.reserve) for m in rows]


def tasks_near_limit(threshold: float = 0.8, limit: int = 20) -> list[tuple[str, str, float]]:
    """(task id, meter, used fraction) of live tasks whose current attempt has a meter at least
    ``threshold`` used (reserved + posted + unknown), the fullest first."""
    # Filtered and ordered in the database, so the fullest are found however many tasks have a
    # budget (a slice before the filter would miss them).
    used = ExpressionWrapper(
        (F("reserved") + F("posted") + F("unknown")) * 1.0 / F("limit"), output_field=FloatField()
    )
    rows = (
        BudgetMeter.objects.filter(attempt_id=F("task__current_attempt_id"), limit__gt=0)
        .exclude(task__condition="terminal")
        .annotate(used=used)
        .filter(used__gte=threshold)
        .order_by("-used", "task_id")
        .values_list("task_id", "meter", "used")[:limit]
    )
    return [(task_id, name, float(fraction)) for task_id, name, fraction in rows]
