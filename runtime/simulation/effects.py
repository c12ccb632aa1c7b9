"""The receivers' oracles (docs/simulation.md, "Invariants"), judged on the receivers' own
records (runtime.sandbox) read past marks: at most one effect per key within each receiver's
contract, a charge above the threshold only with a person's approval of exactly it, and a
possible effect left to a person (an operation a machine ended never has an effect at its
receiver, nor a call nobody confirmed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Count

from runtime.models import (
    Operation,
    Resolution,
)
from runtime.sandbox.models import Charge, Notification, Reservation
from runtime.simulation.facts import APPROVAL_ABOVE_CENTS, contract
from runtime.simulation.journal import ENDINGS, Journal
from runtime.simulation.schedule import Violation

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


class Effects(Journal):
    def _effects(self) -> set[str]:
        """New effects the receivers recorded: at most one per key within each receiver's
        contract; a charge above the threshold only with a person's approval of exactly it.
        Returns the operations they belong to."""
        charges, reservations, notes = self._new_effects()
        if not (charges or reservations or notes):
            return set()
        keys = {c[1] for c in charges} | {r[1] for r in reservations} | {n[1] for n in notes}
        self._effect_keys |= keys
        self.checks += 1
        self._once_per_key(charges, reservations, notes)
        owners = dict(
            Operation.objects.filter(idempotency_key__in=keys, task_id__in=self.tasks).values_list(
                "idempotency_key", "pk"
            )
        )
        self._charges_approved(charges, owners)
        return set(owners.values())

    def _new_effects(self) -> tuple[list[Any], list[Any], list[Any]]:
        """The receivers' rows recorded since the last look (charges, reservations,
        notifications), and the marks moved past them."""
        marks = self._effect_marks
        newest = _newest()
        if all(newest[name] <= marks[name] for name in marks):
            return [], [], []
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
        if charges:
            marks["charge"] = charges[-1][0]
        if reservations:
            marks["reservation"] = reservations[-1][0]
        if notes:
            marks["notification"] = notes[-1][0]
        return charges, reservations, notes

    @staticmethod
    def _once_per_key(charges: list[Any], reservations: list[Any], notes: list[Any]) -> None:
        """``effect-once``: one charge and one refund per key, no charge refunded twice, one
        reservation per key, a notification repeated only as often as a person retried it."""
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

    def _charges_approved(self, charges: list[Any], owners: dict[str, str]) -> None:
        """A charge above the threshold only with a person's approval of exactly it."""
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
