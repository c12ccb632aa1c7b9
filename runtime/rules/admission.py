"""When a task admits no new work, as a table: each refusal its code and message, and the same
test twice, in Python over the task's facts and in SQL over the task row. ``task_admission_check``
runs the Python tests; the proposal statement (runtime/sql/propose.sql) refuses inside itself
with ``admission_refusal_sql``, rendered from the SQL ones (tests/runtime/test_hotpath.py runs
both over every combination)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from runtime.errors import TaskRefused
from runtime.rules.statuses import Cancellation, TaskCondition


@dataclass(frozen=True)
class Admission:
    """What admission reads of a task (its row, at ``now``)."""

    condition: str
    cancellation: str
    paused: bool
    deadline: datetime | None
    now: datetime


@dataclass(frozen=True)
class AdmissionRefusal:
    """One reason a task admits no new work: its code and message, and the same test twice,
    in Python over the task's facts and in SQL over the task row ``{t}`` at ``{now}``. A refusal
    settles to nothing: the request is refused (TaskRefused, 409) and nothing is written."""

    code: str
    message: str
    applies: Callable[[Admission], bool]
    sql: str


# In the order they are checked.
ADMISSION_REFUSALS: tuple[AdmissionRefusal, ...] = (
    AdmissionRefusal(
        "task_cancelled",
        "the task was cancelled",
        lambda a: a.cancellation != Cancellation.NONE,
        f"{{t}}.cancellation <> '{Cancellation.NONE}'",
    ),
    AdmissionRefusal(
        "task_terminal",
        "the task has ended",
        lambda a: a.condition == TaskCondition.TERMINAL,
        f"{{t}}.condition = '{TaskCondition.TERMINAL}'",
    ),
    AdmissionRefusal("task_paused", "the task is paused", lambda a: a.paused, "{t}.paused"),
    AdmissionRefusal(
        "deadline_exceeded",
        "the task's deadline has passed",
        lambda a: a.deadline is not None and a.now >= a.deadline,
        "{now} >= {t}.deadline",
    ),
)
_BY_CODE = {r.code: r for r in ADMISSION_REFUSALS}


def task_admission_check(
    *, condition: str, cancellation: str, paused: bool, deadline: datetime | None, now: datetime
) -> None:
    """Raise TaskRefused with the contract's code when the task admits no new work. Pure."""
    facts = Admission(condition, cancellation, paused, deadline, now)
    for refusal in ADMISSION_REFUSALS:
        if refusal.applies(facts):
            raise TaskRefused(refusal.message, code=refusal.code)


def admission_refused(code: str) -> TaskRefused:
    """The refusal a statement reported by its code (admission_refusal_sql)."""
    return TaskRefused(_BY_CODE[code].message, code=code)


def admission_refusal_sql(task: str, now: str) -> str:
    """A SQL expression over the task row ``task`` that is true when the task admits work at
    ``now`` and otherwise fails the statement with the refusal's code (``runtime_refuse``,
    PostgreSQL; runtime.db.refusal_code reads it back)."""
    whens = "\n".join(
        f"    WHEN {r.sql.format(t=task, now=now)} THEN runtime_refuse('{r.code}')"
        for r in ADMISSION_REFUSALS
    )
    return f"CASE\n{whens}\n    ELSE true END"
