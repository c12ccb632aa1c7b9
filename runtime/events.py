"""The append-only journal: one row per accepted change, numbered per task.

The cursor (``seq``) is taken by bumping ``Task.event_seq`` under the task's row lock, inside the
transaction that writes the event, so a reader that has seen seq N has seen every event before it
that will ever exist. Broadcasts are hints sent after commit; readers always catch up from here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connection, transaction

from runtime.db import db_datetime, fetchone_named
from runtime.logcontext import transition_fields, transition_log
from runtime.models import Event, Operation
from runtime.rules.statuses import CONDITION_DEFAULT, CONDITION_RULES, OperationStatus
from runtime.rules.statuses import TaskCondition as C
from runtime.sqlfiles import Slot, column_list, queries

S = OperationStatus

log = logging.getLogger(__name__)

TASK_GROUP = "task.{task_id}"
# How long the hint sender gathers hints before a flush (see _HintSender). At 50 ms the
# sender's thread still took a quarter of a proposing process's CPU under a burst (one
# group_send per task per flush); a page moving 200 ms after the commit is not noticed.
HINT_LINGER_SECONDS = 0.2
FEED_GROUP = "feed"


@dataclass(frozen=True)
class TaskRow:
    """The task as the journal statement left it (read back with RETURNING)."""

    id: str
    event_seq: int
    condition: str
    outcome: str | None
    state_version: int
    cancellation: str
    paused: bool
    deadline: datetime | None
    ops_active: int = 0


# Each status group of the condition rules is kept as a counter on the task row.
COUNTERS = {S.ACTIVE: "active", S.CLAIMABLE: "claimable", S.BLOCKED: "blocked"}


def condition_case_sql(delta: str = "%(d_{})s") -> str:
    """The SQL CASE deriving a task's condition from its counters plus this statement's deltas,
    rendered from ``statuses.CONDITION_RULES`` (the rule's one statement). ``delta`` names
    where a counter's delta comes from: a bound parameter, or a column of a batch's deltas."""
    whens = "".join(
        f"\n  WHEN ops_{COUNTERS[group]} + {delta.format(COUNTERS[group])} > 0 THEN '{condition}'"
        for condition, group in CONDITION_RULES
    )
    return (
        f"CASE WHEN condition = '{C.TERMINAL}' THEN '{C.TERMINAL}'{whens}"
        f"\n  ELSE '{CONDITION_DEFAULT}' END"
    )


def task_row(row: dict[str, Any], prefix: str = "") -> TaskRow:
    """The TaskRow of a statement's row, read by column name (``TASK_COLUMNS``, each under
    ``prefix`` when the statement names them apart from another row's)."""
    return TaskRow(
        id=row[prefix + "id"],
        event_seq=row[prefix + "event_seq"],
        condition=row[prefix + "condition"],
        outcome=row[prefix + "outcome"],
        state_version=row[prefix + "state_version"],
        cancellation=row[prefix + "cancellation"],
        paused=bool(row[prefix + "paused"]),
        deadline=db_datetime(row[prefix + "deadline"]),
        ops_active=int(row[prefix + "ops_active"]),
    )


# The task row's columns a journal statement returns (TaskRow's fields, in order).
TASK_COLUMNS = tuple(f.name for f in fields(TaskRow))

# The values the journal's fragments (runtime/sql/journal.sql) are filled with: the
# condition CASE rendered from the rules, and the task row's columns.
JOURNAL_SLOTS: dict[str, Slot] = {
    "condition_after_deltas": condition_case_sql(),
    "condition_after_batch_deltas": condition_case_sql("d.d_{}"),
    "task_columns": lambda alias="", prefix="": column_list(TASK_COLUMNS, alias, prefix),
    "task_nulls": ", ".join("NULL" for _ in TASK_COLUMNS),
}

_SQL = queries("task_touch_by_id", slots=JOURNAL_SLOTS)


def task_touch_txn(task_id: str, deltas: tuple[int, int, int], now: datetime) -> TaskRow:
    """Take the next journal position for a task and apply operation-count deltas, deriving its
    live condition in the same statement. Must run inside the caller's transaction: the row lock
    it takes is what orders the task's events."""
    d_active, d_claimable, d_blocked = deltas
    with connection.cursor() as cur:
        cur.execute(
            _SQL["task_touch_by_id"],
            {
                "d_active": d_active,
                "d_claimable": d_claimable,
                "d_blocked": d_blocked,
                "now": now,
                "task_id": task_id,
            },
        )
        row = fetchone_named(cur)
    if row is None:
        raise LookupError(f"task {task_id} vanished inside its own transaction")
    return task_row(row)


def event_append_txn(
    *,
    task_id: str,
    type: str,
    state_version: int | None,
    now: datetime,
    deltas: tuple[int, int, int] = (0, 0, 0),
    operation_id: str | None = None,
    op: Operation | None = None,
    actor: str,
    data: dict[str, Any] | None = None,
) -> tuple[Event, TaskRow]:
    """Append one event to the task's journal inside the caller's transaction; the hint to live
    readers and the event's log line go out only after commit. ``state_version`` is the version
    of the entity the event is about; None for an event about the task that changes no version
    (it records the task's). ``op``: the operation the event is about, as it left it (its id is
    ``operation_id``; its attempt, execution and lease generation are named in the log line)."""
    if op is not None:
        operation_id = op.pk
    task = task_touch_txn(task_id, deltas, now)
    payload = dict(data or {})
    payload.setdefault("task_condition", task.condition)
    payload.setdefault("task_state_version", task.state_version)
    event = Event.objects.create(
        task_id=task_id,
        seq=task.event_seq,
        type=type,
        at=now,
        state_version=task.state_version if state_version is None else state_version,
        operation_id=operation_id,
        actor=actor,
        data=payload,
    )
    logged = transition_fields(
        type, task_id=task_id, actor=actor, op=op, operation_id=operation_id, data=payload
    )
    transaction.on_commit(lambda: event_committed(task_id, task.event_seq, type, logged))
    return event, task


def event_committed(task_id: str, seq: int, type: str, logged: dict[str, Any]) -> None:
    """After the commit of an event: its log line (runtime.logcontext), and the live readers'
    hint."""
    transition_log(logged)
    event_hint(task_id, seq, type)


def event_hint(task_id: str, seq: int, type: str) -> None:
    """Tell live readers that the journal moved. At-most-once and lossy by design (the channel
    layer drops over capacity); readers catch up from the journal, so a lost hint only delays.
    Sent from a background loop so the committing worker never waits on Redis."""
    _hints.send({"type": "journal.hint", "task": task_id, "seq": seq, "event": type})


class _HintSender:
    """One daemon thread per process with a long-lived event loop: the channel layer keeps its
    connections on that loop, and callers only record the hint (microseconds, never blocking).

    Hints coalesce: a hint only wakes a reader, which then reads the journal from its cursor, so
    of the hints a task gathers before the loop flushes only the newest is sent, and the feed gets
    one per flush. Under load this turns one ``group_send`` pair per event (several Redis round
    trips each, and the loop's CPU competing with the committing worker) into one per task per
    flush. A flush starts HINT_LINGER_SECONDS after the first hint it carries: a person's page
    moves that much later, imperceptibly, and a burst of events costs a handful of sends."""

    MAX_PENDING = 10_000

    def __init__(self) -> None:
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._layer: Any = None
        self._pending: dict[str, dict[str, Any]] = {}
        self._scheduled = False
        self._lock = threading.Lock()

    def _start(self) -> bool:

        layer = get_channel_layer()
        # The in-memory layer lives in one process and one loop: its readers follow the
        # journal by polling instead (embedded mode).
        if layer is None or isinstance(layer, InMemoryChannelLayer):
            return False
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="journal-hints", daemon=True)
        thread.start()
        self._loop, self._layer, self._pid = loop, layer, os.getpid()
        self._pending, self._scheduled = {}, False
        return True

    def send(self, message: dict[str, Any]) -> None:
        try:
            with self._lock:
                if self._pid != os.getpid() and not self._start():
                    return
                task = message["task"]
                if task not in self._pending and len(self._pending) >= self.MAX_PENDING:
                    return
                self._pending[task] = message
                if self._scheduled:
                    return
                self._scheduled = True
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(
                loop.call_later, HINT_LINGER_SECONDS, lambda: loop.create_task(self._flush())
            )
        except Exception:  # a hint must never fail the committed work it reports
            log.debug("journal hint not sent", exc_info=True)

    async def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            self._scheduled = False
        if not pending:
            return
        try:
            groups = {TASK_GROUP.format(task_id=task): m for task, m in pending.items()}
            groups[FEED_GROUP] = next(reversed(pending.values()))  # the newest wakes the feed
            watched = await _watched(self._layer, list(groups))
            for group, hint in groups.items():
                if watched is None or group in watched:
                    await self._layer.group_send(group, hint)
        except Exception:
            log.debug("journal hint not delivered", exc_info=True)


async def _watched(layer: Any, groups: list[str]) -> set[str] | None:
    """Which of ``groups`` have a live member, asked in one round trip per Redis host, or None
    when the layer cannot say (then every group is sent to). A ``group_send`` costs two round
    trips even to a group nobody is in, and under load most tasks' groups are empty: nobody
    has their page open. Counted as the layer counts members (those added within its
    group_expiry), so a group left out here is one its group_send would have found empty."""
    try:
        key, shard, connect = layer._group_key, layer.consistent_hash, layer.connection
        since = int(time.time()) - int(layer.group_expiry)
    except AttributeError:
        return None
    by_shard: dict[int, list[str]] = {}
    for group in groups:
        by_shard.setdefault(shard(group), []).append(group)
    watched: set[str] = set()
    for index, names in by_shard.items():
        pipe = connect(index).pipeline(transaction=False)
        for group in names:
            pipe.zcount(key(group), since, "+inf")
        counts = await pipe.execute()
        watched.update(group for group, n in zip(names, counts, strict=True) if int(n))
    return watched


_hints = _HintSender()


def events_after(task_id: str, after: int, limit: int = 200) -> list[Event]:
    """The task's events strictly after the cursor, oldest first (keyset, no OFFSET)."""
    return list(Event.objects.filter(task_id=task_id, seq__gt=after).order_by("seq")[:limit])


def feed_after(after_id: int, limit: int = 200) -> list[Event]:
    """Events of all tasks after a global position, for hint-driven pages (ids may commit out of
    order, which is harmless here: these only tell a page to refresh)."""
    return list(Event.objects.filter(id__gt=after_id).order_by("id")[:limit])


def feed_head() -> int:
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    return int(last or 0)
