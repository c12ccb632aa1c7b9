"""The invariants (docs/simulation.md, "Invariants"), each written from the specification
(DESIGN.md and the seeds) and judged on facts recorded apart from the code under test: the
receivers' own records (runtime.sandbox), the journal, and what the simulation itself saw
(runtime.simulation.facts). None imports the runtime's own definitions of what they check.

Checked after every step, on what the step touched: the tasks of the events it journalled and
of the effects the receivers recorded (read from marks, so a step costs what it changed, not
what the run holds); and once over everything at the end of a run (``full``)."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Count, Exists, F, Max, Min, OuterRef

from runtime.models import (
    Approval,
    Artifact,
    CheckResult,
    Event,
    Invocation,
    Operation,
    OutboxMessage,
    RequiredCheck,
    Resolution,
    Signal,
    Task,
)
from runtime.sandbox.models import Charge, Notification, Reservation
from runtime.simulation.edges import EdgeLog
from runtime.simulation.facts import APPROVAL_ABOVE_CENTS, UNDONE_BY, Facts, contract
from runtime.simulation.ledger import MOVING, check_budgets, meters_of
from runtime.simulation.schedule import Violation

# Endings that assert what became of the work; a machine may not write them over an effect
# (or a possible one): those go to a person.
ENDINGS = ("failed", "cancelled", "expired")
# Tools whose receiver keeps a row under the call's key for each effect.
RECORDED = ("demo.payments.charge", "demo.payments.refund", "demo.inventory.reserve", "demo.notify")


def person(actor: str) -> bool:
    return actor.startswith("user:")


class Op(NamedTuple):
    id: str
    task_id: str
    status: str
    kind: str
    tool: str
    executor: str
    lease_expires_at: datetime | None
    status_reason: str
    idempotency_key: str
    compensates_id: str | None
    attempt_id: str
    result: Any
    estimate: Any
    step: str
    signal: str
    called: bool  # a call of it was dispatched (an invocation is recorded)
    announced: bool  # its dispatch is announced (an outbox row)


def _newest() -> dict[str, int]:
    """The receivers' newest row ids, in one round trip."""
    tables = {
        "charge": Charge._meta.db_table,
        "reservation": Reservation._meta.db_table,
        "notification": Notification._meta.db_table,
    }
    sql = "SELECT " + ", ".join(f"(SELECT MAX(id) FROM {t})" for t in tables.values())  # noqa: S608
    with connection.cursor() as cur:
        cur.execute(sql)
        row = cur.fetchone()
    return {name: int(value or 0) for name, value in zip(tables, row, strict=True)}


def _data(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


class Oracles:
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

    # --- after each step ----------------------------------------------------------------------

    def after_step(self) -> None:
        touched, ended, succeeded = self._journal()
        effected = self._effects()
        for op_id in effected:
            task_id = self.facts.task_of.get(op_id)
            if task_id is not None:
                touched.add(task_id)
        if touched:
            self._judge(touched, ended | effected, succeeded)

    def full(self) -> None:
        """Every invariant over everything the run made (at its end)."""
        self._journal()
        self._effects()
        self._journal_whole()
        ops = set(Operation.objects.values_list("pk", flat=True))
        done = set(Task.objects.filter(outcome="succeeded").values_list("pk", flat=True))
        self._judge(set(self.tasks), ops, done)

    # --- the journal: gapless, ordered, and what it says moved --------------------------------

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

    # --- the receivers' records ---------------------------------------------------------------

    def _effects(self) -> set[str]:
        """New effects the receivers recorded: at most one per key within each receiver's
        contract; a charge above the threshold only with a person's approval of exactly it.
        Returns the operations they belong to."""
        marks = self._effect_marks
        newest = _newest()
        if all(newest[name] <= marks[name] for name in marks):
            return set()
        charges = list(
            Charge.objects.filter(pk__gt=marks["charge"])
            .order_by("pk")
            .values_list("pk", "key", "kind", "account", "amount_cents", "refunds")
        )
        reservations = list(
            Reservation.objects.filter(pk__gt=marks["reservation"])
            .order_by("pk")
            .values_list("pk", "key")
        )
        notes = list(
            Notification.objects.filter(pk__gt=marks["notification"])
            .order_by("pk")
            .values_list("pk", "key")
        )
        if not (charges or reservations or notes):
            return set()
        if charges:
            marks["charge"] = charges[-1][0]
        if reservations:
            marks["reservation"] = reservations[-1][0]
        if notes:
            marks["notification"] = notes[-1][0]
        keys = {c[1] for c in charges} | {r[1] for r in reservations} | {n[1] for n in notes}
        self._effect_keys |= keys
        self.checks += 1
        for kind in ("charge", "refund"):
            mine = [c[1] for c in charges if c[2] == kind]
            rows = (
                Charge.objects.filter(kind=kind, key__in=mine).values("key").annotate(n=Count("id"))
            )
            for row in rows.filter(n__gt=1)[:1]:
                raise Violation(
                    "effect-once", f"payments made {row['n']} {kind}s under {row['key']}"
                )
        undone = [c[5] for c in charges if c[2] == "refund"]
        twice = (
            Charge.objects.filter(kind="refund", refunds__in=undone)
            .values("refunds")
            .annotate(n=Count("id"))
        )
        for row in twice.filter(n__gt=1)[:1]:
            raise Violation("effect-once", f"charge {row['refunds']} refunded {row['n']} times")
        held = (
            Reservation.objects.filter(key__in=[r[1] for r in reservations])
            .values("key")
            .annotate(n=Count("id"))
        )
        for row in held.filter(n__gt=1)[:1]:
            raise Violation(
                "effect-once", f"inventory reserved {row['n']} times under {row['key']}"
            )
        sent = (
            Notification.objects.filter(key__in=[n[1] for n in notes])
            .values("key")
            .annotate(n=Count("id"))
        )
        for row in sent.filter(n__gt=1):
            retried = Resolution.objects.filter(
                operation__idempotency_key=row["key"], resolution="retry"
            ).count()
            if row["n"] > 1 + retried:
                raise Violation(
                    "effect-once",
                    f"notify sent {row['n']} times for {row['key']} "
                    f"({retried} retries by a person)",
                )
        owners = dict(
            Operation.objects.filter(idempotency_key__in=keys, task_id__in=self.tasks).values_list(
                "idempotency_key", "pk"
            )
        )
        for _, key, kind, account, amount, _refunds in charges:
            if kind != "charge" or amount <= APPROVAL_ABOVE_CENTS:
                continue
            gate = self.facts.gates.get(owners.get(key, ""))
            approved = gate is not None and gate.released
            if (
                not approved
                or gate is None
                or (gate.params.get("account"), gate.params.get("amount_cents"))
                != (account, amount)
            ):
                raise Violation(
                    "no-release-on-expired-or-denied",
                    f"{amount} cents charged under {key} without a person's approval of it "
                    f"(approved: {gate.params if gate else 'nothing'})",
                )
        return set(owners.values())

    # --- what the step touched -------------------------------------------------------------------

    def _judge(self, touched: set[str], judged_ops: set[str], succeeded: set[str]) -> None:
        facts = self.facts
        # The tasks judged, their ancestors and their descendants (ledgers draw on each other).
        related = set(touched)
        grown = True
        while grown:
            more = {p for c, p in facts.parent.items() if c in related}
            more |= {c for c, p in facts.parent.items() if p in related}
            grown = not more <= related
            related |= more
        task_rows = {
            row[0]: row[1:]
            for row in Task.objects.filter(pk__in=related).values_list(
                "pk", "condition", "outcome", "event_seq", "paused", "compensate_on"
            )
        }
        rows = (
            Operation.objects.filter(task_id__in=related)
            .annotate(
                called=Exists(Invocation.objects.filter(operation_id=OuterRef("pk"))),
                announced=Exists(OutboxMessage.objects.filter(operation_id=OuterRef("pk"))),
            )
            .values_list(*Op._fields)
        )
        ops = [Op(*row) for row in rows]
        ops_of: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            ops_of[op.task_id].append(op)
        mine = [op for op in ops if op.task_id in touched]
        self._cursors(touched, task_rows)
        self._first_endings(touched, task_rows)
        self._endings([op for op in mine if op.id in judged_ops])
        self._nothing_lost(mine, task_rows)
        if any(facts.budgets.get(t) for t in related):
            self.checks += check_budgets(facts, touched, meters_of(related), ops_of, task_rows)
        if any(op.tool in RECORDED for op in mine):
            self._approvals(touched)
        if any(op.kind == Operation.KIND_WAIT_SIGNAL for op in mine):
            self._signals(touched, mine)
        self._checks(succeeded & touched)
        self._sagas(touched, task_rows, ops_of)

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

    def _endings(self, ops: list[Op]) -> None:
        """The promise: a possible effect goes to a person. An operation a machine ended
        failed, expired or cancelled never has an effect at its receiver, nor a claim whose
        call nobody confirmed (by the simulation's own record of what it reported); and one a
        machine ended succeeded has its effect at its receiver."""
        for op in ops:
            self.checks += 1
            status, actor = self._ended_by.get(op.id, (op.status, "?"))
            if status != op.status or person(actor):
                continue
            has_effect = op.idempotency_key in self._effect_keys
            if op.status in ENDINGS and has_effect:
                raise Violation(
                    "effect-goes-to-a-person",
                    f"{op.id} ({op.tool}) ended {op.status} by {actor}, but its receiver holds "
                    f"an effect under {op.idempotency_key}",
                )
            doubt = self.facts.doubt.get(op.id)
            if op.status in ENDINGS and doubt and contract(op.tool) != "pure":
                raise Violation(
                    "possible-effect-goes-to-a-person",
                    f"{op.id} ({op.tool}) ended {op.status} by {actor}, with the call of "
                    f"generation(s) {sorted(doubt)} never confirmed",
                )
            if op.status == "succeeded" and op.tool in RECORDED and not has_effect:
                raise Violation(
                    "effect-once",
                    f"{op.id} ({op.tool}) succeeded by {actor}, yet its receiver holds nothing "
                    f"under {op.idempotency_key}",
                )

    def _nothing_lost(self, ops: list[Op], task_rows: dict[str, Any]) -> None:
        """Every operation is terminal, unresolved with evidence, or still owned or on its way:
        running under a lease, pending with an announcement (or in a paused task), or waiting."""
        for op in ops:
            self.checks += 1
            paused = task_rows[op.task_id][3]
            if op.status == "running" and op.lease_expires_at is None:
                raise Violation("no-operation-lost", f"{op.id} running without a lease")
            if op.status == "unresolved" and not op.called and not op.status_reason:
                raise Violation("no-operation-lost", f"{op.id} unresolved without evidence")
            if (
                op.status in ("pending", "retry_scheduled")
                and op.kind == Operation.KIND_TOOL
                and op.executor == Operation.EXECUTOR_WORKER
                and not op.announced
                and not paused
            ):
                raise Violation("no-operation-lost", f"{op.id} {op.status} and announced nowhere")

    def _approvals(self, touched: set[str]) -> None:
        self.checks += 1
        late = Approval.objects.filter(
            operation__task_id__in=touched, status="released", released_at__gte=F("expires_at")
        )
        for approval in late[:1]:
            raise Violation(
                "no-release-on-expired-or-denied",
                f"approval {approval.pk} released at {approval.released_at} after its expiry "
                f"{approval.expires_at}",
            )

    def _signals(self, touched: set[str], ops: list[Op]) -> None:
        """A signal is delivered exactly once to one wait, and none is lost: every consumed
        signal names a wait that succeeded with that very event; no wait consumed two; every
        signal wait that succeeded consumed one; a buffered signal is never left waiting beside
        a wait for its name; a duplicate or late signal is never consumed."""
        waits = {op.id: op for op in ops if op.kind == Operation.KIND_WAIT_SIGNAL}
        signals = list(Signal.objects.filter(task_id__in=touched).order_by("received_at", "id"))
        if not signals and not waits:
            return
        self.checks += 1
        consumed: dict[str, str] = {}
        for sig in signals:
            if sig.consumed_at is None:
                continue
            if sig.disposition not in (Signal.DELIVERED, Signal.BUFFERED):
                raise Violation("signal-once", f"{sig.disposition} signal {sig.pk} consumed")
            op = waits.get(sig.operation_id or "")
            event = _data(op.result).get("event_id") if op is not None else None
            if op is None or op.status != "succeeded" or event != sig.event_id:
                raise Violation(
                    "signal-once",
                    f"signal {sig.pk} ({sig.event_id}) consumed by {sig.operation_id}, which is "
                    f"{op.status if op else 'no wait'} with event {event}",
                )
            if sig.operation_id in consumed:
                raise Violation(
                    "signal-once",
                    f"wait {sig.operation_id} consumed {consumed[sig.operation_id]} and {sig.pk}",
                )
            consumed[str(sig.operation_id)] = sig.pk
        for op in waits.values():
            if op.status == "succeeded" and op.id not in consumed:
                raise Violation("signal-once", f"wait {op.id} succeeded with no signal consumed")
        waiting = {(op.task_id, op.signal) for op in waits.values() if op.status == "waiting"}
        for sig in signals:
            left = sig.disposition == Signal.BUFFERED and sig.consumed_at is None
            if left and (sig.task_id, sig.name) in waiting:
                raise Violation(
                    "signal-once",
                    f"buffered signal {sig.pk} left beside a wait for {sig.name!r}",
                )

    def _checks(self, done: set[str]) -> None:
        """A task succeeds only when every required check passed on its current accepted
        artifact: the simulation knows whether that artifact's bytes satisfy the schema, and a
        pass recorded on an artifact since replaced does not count."""
        for rc in RequiredCheck.objects.filter(task_id__in=done).order_by("id"):
            self.checks += 1
            name = str(rc.config.get("artifact"))
            current = Artifact.objects.filter(task_id=rc.task_id, name=name, status="accepted")
            subject = current.first()
            passed = (
                subject is not None
                and CheckResult.objects.filter(
                    task_id=rc.task_id,
                    name=rc.name,
                    result="passed",
                    subject_id=subject.pk,
                    subject_digest=subject.digest,
                ).exists()
            )
            valid = subject is not None and self.valid.get(subject.pk, False)
            if current.count() != 1 or not passed or not valid:
                raise Violation(
                    "success-needs-checks",
                    f"task {rc.task_id} succeeded but check {rc.name!r} did not pass on its "
                    f"current {name} ({subject.pk if subject else 'none accepted'}, "
                    f"content {'valid' if valid else 'invalid'}, pass recorded: {passed})",
                )

    def _sagas(
        self, touched: set[str], task_rows: dict[str, Any], ops_of: dict[str, list[Op]]
    ) -> None:
        """Every succeeded effect of a task that ended failed or cancelled with
        ``compensate_on`` is compensated, being compensated, or with a person: once nothing of
        the task is left to run or with a person, no effect that can be undone is still plainly
        succeeded."""
        for task_id in touched:
            condition, outcome, _, _, wanted = task_rows[task_id]
            if condition != "terminal" or not outcome or outcome not in (wanted or []):
                continue
            ops = ops_of.get(task_id, [])
            # Work still moving, or an undo a person must settle first (the saga waits for it).
            if any(op.status in MOVING or op.status == "unresolved" for op in ops):
                continue
            self.checks += 1
            for op in ops:
                # A success a person asserted with evidence only (no receiver result) names no
                # effect the saga could undo.
                asserted = isinstance(op.result, dict) and "resolution" in op.result
                if (
                    op.status == "succeeded"
                    and op.compensates_id is None
                    and op.tool in UNDONE_BY
                    and not asserted
                ):
                    raise Violation(
                        "saga-unwound",
                        f"task {task_id} ended {outcome} (compensate_on) and is at rest, but "
                        f"{op.id} ({op.tool}, step {op.step!r}) is still succeeded",
                    )


INVARIANTS = (
    "fencing",
    "executor-respected",
    "no-claim-when-stopped",
    "no-admission-when-stopped",
    "no-release-on-expired-or-denied",
    "keys-unambiguous",
    "effect-once",
    "effect-goes-to-a-person",
    "possible-effect-goes-to-a-person",
    "no-operation-lost",
    "usage-posted-as-reported",
    "holds-released-at-rest",
    "budgets-balance",
    "children-in-parents",
    "journal-gapless",
    "journal-ordered",
    "first-ending-stands",
    "signal-once",
    "timer-on-time",
    "success-needs-checks",
    "saga-unwound",
    "undo-not-stopped",
    "deadline-respected",
    "no-unexpected-error",
)
