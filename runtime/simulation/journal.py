"""The journal's oracles (docs/simulation.md, "Invariants"): each task's events numbered 1..n
with no gap and the cursor at n, their times never going back, a timer firing once and never
early, a task's first ending standing; and what the journal says moved, read past a mark (the
operations it ended, the tasks it touched, the (from, to) pairs of runtime.simulation.edges).
``Journal`` holds every oracle's state; runtime.simulation.effects and .oracles build on it."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Count, Max, Min

from runtime.models import (
    Event,
    Task,
)
from runtime.simulation.edges import EdgeLog
from runtime.simulation.facts import Facts
from runtime.simulation.schedule import Violation

# Endings that assert what became of the work; a machine may not write them over an effect
# (or a possible one): those go to a person.
ENDINGS = ("failed", "cancelled", "expired")


def _data(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


class Journal:
    def __init__(
        self, facts: Facts, tasks: list[str], valid: dict[str, bool], timer_due: dict[str, Any]
    ) -> None:
        self.facts = facts
        self.tasks = tasks  # the world's list (it grows)
        self.valid = valid
        self.timer_due = timer_due
        self.checks = 0
        self.edges = EdgeLog()
        self._event_mark = 0
        self._effect_marks = {"charge": 0, "reservation": 0, "notification": 0}
        self._seq: dict[str, int] = {}
        self._at: dict[str, datetime] = {}
        self._first: dict[str, tuple[str, str | None]] = {}
        self._ended_by: dict[str, tuple[str, str]] = {}  # op -> (status it was moved to, by whom)
        self._fired: dict[str, int] = defaultdict(int)
        self._effect_keys: set[str] = set()

    def _journal(self) -> tuple[set[str], set[str], set[str]]:
        rows = list(
            Event.objects.filter(id__gt=self._event_mark)
            .order_by("id")
            .values_list("id", "task_id", "seq", "type", "at", "operation_id", "actor", "data")
        )
        touched: set[str] = set()
        ended: set[str] = set()
        succeeded: set[str] = set()
        if not rows:
            return touched, ended, succeeded
        self._event_mark = rows[-1][0]
        by_task: dict[str, list[Any]] = defaultdict(list)
        for row in rows:
            by_task[row[1]].append(row)
        for task_id, events in by_task.items():
            touched.add(task_id)
            self.checks += 1
            for _, _, seq, type, at, op_id, actor, raw in sorted(events, key=lambda r: r[2]):
                last = self._seq.get(task_id, 0)
                if seq != last + 1:
                    raise Violation("journal-gapless", f"task {task_id}: event {seq} after {last}")
                if task_id in self._at and at < self._at[task_id]:
                    raise Violation(
                        "journal-ordered",
                        f"task {task_id}: event {seq} at {at} after {self._at[task_id]}",
                    )
                self._seq[task_id], self._at[task_id] = seq, at
                data = _data(raw)
                self.edges.feed(task_id, type, op_id, data)
                target = data.get("to")
                if op_id is not None and target is not None and data.get("from") is not None:
                    self._ended_by[op_id] = (str(target), actor)
                    if target in ENDINGS or target == "succeeded":
                        ended.add(op_id)
                if type == "timer.fired" and op_id is not None:
                    self._fired[op_id] += 1
                    due = self.timer_due.get(op_id)
                    if self._fired[op_id] > 1 or (due is not None and at < due):
                        raise Violation(
                            "timer-on-time",
                            f"timer {op_id} fired {self._fired[op_id]} time(s), at {at}, due {due}",
                        )
                if type == "task.succeeded":
                    succeeded.add(task_id)
        return touched, ended, succeeded

    def _journal_whole(self) -> None:
        self.checks += 1
        seqs = Event.objects.values("task_id").annotate(n=Count("id"), lo=Min("seq"), hi=Max("seq"))
        heads = dict(Task.objects.values_list("pk", "event_seq"))
        for row in seqs:
            if row["lo"] != 1 or row["hi"] != row["n"] or heads.get(row["task_id"]) != row["hi"]:
                raise Violation(
                    "journal-gapless",
                    f"task {row['task_id']}: {row['n']} events, seq {row['lo']}.."
                    f"{row['hi']}, cursor {heads.get(row['task_id'])}",
                )
        ats = list(Event.objects.order_by("task_id", "seq").values_list("task_id", "at"))
        for (t1, a1), (t2, a2) in itertools.pairwise(ats):
            if t1 == t2 and a2 < a1:
                raise Violation("journal-ordered", f"task {t1}: an event at {a2} after {a1}")

    def _cursors(self, touched: set[str], task_rows: dict[str, Any]) -> None:
        for task_id in touched:
            self.checks += 1
            row = task_rows.get(task_id)
            if row is not None and row[2] != self._seq.get(task_id, 0):
                raise Violation(
                    "journal-gapless",
                    f"task {task_id}: cursor {row[2]}, last event {self._seq.get(task_id, 0)}",
                )

    def _first_endings(self, touched: set[str], task_rows: dict[str, Any]) -> None:
        for task_id in touched:
            self.checks += 1
            condition, outcome = task_rows[task_id][0], task_rows[task_id][1]
            if condition != "terminal":
                if task_id in self._first:
                    raise Violation("first-ending-stands", f"task {task_id} left its ending")
                continue
            first = self._first.setdefault(task_id, (condition, outcome))
            if first != (condition, outcome):
                raise Violation(
                    "first-ending-stands", f"task {task_id} ended {first}, now {outcome}"
                )
