"""Settling many unresolved operations at once (a group of similar ones on /unresolved/): the
same resolution and the same evidence, recorded for each. Each operation is settled by
``runtime.resolutions.operation_resolve`` in its own transaction, guarded on the state version
the person saw, so one that someone else changed meanwhile is refused on its own and the others
still settle; the result says what became of each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.actors import Actor
from runtime.errors import DomainError, InvalidInput
from runtime.policy import can_resolve
from runtime.resolutions import UNRESOLVED_RESOLUTIONS, operation_resolve

MAX_BULK = 50


@dataclass(frozen=True)
class BulkItem:
    operation_id: str
    state_version: int


def _checked(items: list[BulkItem], resolution: str, evidence: str) -> str:
    if resolution not in UNRESOLVED_RESOLUTIONS:
        raise InvalidInput(f"resolution must be one of {', '.join(UNRESOLVED_RESOLUTIONS)}")
    evidence = (evidence or "").strip()
    if not evidence:
        # Settled together, each still needs its reason on record.
        raise InvalidInput("settling several at once needs the evidence, recorded for each")
    if not items:
        raise InvalidInput("select at least one operation")
    if len(items) > MAX_BULK:
        raise InvalidInput(f"settle at most {MAX_BULK} operations at a time")
    if len({item.operation_id for item in items}) != len(items):
        raise InvalidInput("an operation is selected twice")
    return evidence


def operations_resolve_bulk(
    actor: Actor, items: list[BulkItem], *, resolution: str, evidence: str
) -> list[dict[str, Any]]:
    """Settle each of ``items`` with ``resolution`` and ``evidence``; per item, in order, either
    ``{"operation", "ok": True, "status"}`` or ``{"operation", "ok": False, "code",
    "message"}``.

    Preconditions: ``actor`` is support staff or an admin (403 before anything is settled);
    ``resolution`` settles an unresolved operation, ``evidence`` is not blank, 1 to MAX_BULK
    distinct items (400, nothing settled). Each item opens its own transaction: call it outside
    one."""
    can_resolve(actor)
    evidence = _checked(items, resolution, evidence)
    results: list[dict[str, Any]] = []
    for item in items:
        try:
            op = operation_resolve(
                actor,
                item.operation_id,
                resolution=resolution,
                evidence=evidence,
                state_version=item.state_version,
            )
        except DomainError as exc:
            # Each on its own: a stale one, a settled one, or (the role taken away mid-way)
            # a refusal leaves what is already settled, settled.
            results.append(_refused(item, exc))
        else:
            results.append({"operation": op.pk, "ok": True, "status": op.status})
    return results


def _refused(item: BulkItem, exc: DomainError) -> dict[str, Any]:
    return {"operation": item.operation_id, "ok": False, "code": exc.code, "message": exc.message}
