"""The receivers' own logic. Each function is the receiver's side of one request and commits in
its own transaction, independent of the runtime's (the adapter calls it between claim and
acceptance, outside any runtime transaction)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runtime.db import fetchone_named
from runtime.hashing import params_hash
from runtime.keys import key_namespace_of
from runtime.sandbox.models import (
    Charge,
    FenceRecord,
    Notification,
    PaymentRequest,
    Reservation,
    SlowCall,
)
from runtime.sqlfiles import queries

KEY_RETENTION = timedelta(hours=24)


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


# --- fencing -----------------------------------------------------------------------------


def fence_admits_txn(receiver: str, key: str, token: int) -> bool:
    """Record ``token`` as the newest seen for the key, or refuse it when a newer one was seen.
    Inside the receiver's transaction, before its effect: the row stays locked until the effect
    commits, so an older holder that arrives meanwhile waits and is then refused."""
    for _ in range(2):
        if FenceRecord.objects.filter(receiver=receiver, key=key, token__lte=token).update(
            token=token
        ):
            return True
        try:
            with transaction.atomic():
                FenceRecord.objects.create(receiver=receiver, key=key, token=token)
            return True
        except IntegrityError:
            # Someone recorded a token first: compare against it on the next round.
            continue
    return False


def _stale_fence() -> Response:
    return Response(
        409, _err("stale_fencing_token", "a newer holder has acted under this key; refused")
    )


def _same_owner(resource_key: str, request_key: str) -> bool:
    """Like an account boundary at a real provider: a request may touch only what was created
    under a key of the same namespace (the owner of the task, runtime/keys.py)."""
    return key_namespace_of(resource_key) == key_namespace_of(request_key)


# --- payments: Stripe's contract ----------------------------------------------------------


def payments_charge(*, key: str, body: dict[str, Any], fencing_token: int) -> Response:
    """Charge once per key. The first executing request's response is stored and replayed,
    failures included; the same key with another body is refused (422); a request under a key
    whose first request is still executing is refused (409); validation failures store nothing."""
    digest = params_hash(body)
    now = timezone.now()
    try:
        with transaction.atomic():
            if not fence_admits_txn("payments", key, fencing_token):
                return _stale_fence()
            record = PaymentRequest.objects.create(
                key=key, request_hash=digest, fencing_token=fencing_token, created_at=now
            )
    except IntegrityError:
        existing = PaymentRequest.objects.get(key=key)
        if existing.request_hash != digest:
            return Response(422, _err("idempotency_error", "key reused with different parameters"))
        if existing.status != "done":
            return Response(
                409, _err("idempotency_error", "a request with this key is in progress")
            )
        return Response(existing.response_status or 200, dict(existing.response_body or {}))

    account = body.get("account")
    amount = body.get("amount_cents")
    if not isinstance(account, str) or not account or not isinstance(amount, int) or amount <= 0:
        # Validation fails before execution: nothing is saved under the key.
        PaymentRequest.objects.filter(pk=record.pk).delete()
        return Response(400, _err("invalid_request", "account and a positive amount_cents needed"))
    with transaction.atomic():
        if str(account).startswith("declined"):
            status, response = 402, _err("card_declined", "the card was declined")
        else:
            charge = Charge.objects.create(
                charge_id=f"ch_{secrets.token_hex(8)}",
                key=key,
                account=account,
                amount_cents=amount,
                fencing_token=fencing_token,
                created_at=now,
            )
            status = 200
            response = {
                "id": charge.charge_id,
                "object": "charge",
                "account": account,
                "amount_cents": amount,
                "status": "succeeded",
            }
        PaymentRequest.objects.filter(pk=record.pk).update(
            status="done", response_status=status, response_body=response
        )
    return Response(status, response)


def payments_refund(*, key: str, charge_id: str, fencing_token: int) -> Response:
    """Refund a charge once per key (replay contract, like charges)."""
    body = {"charge": charge_id}
    digest = params_hash(body)
    existing = PaymentRequest.objects.filter(key=key).first()
    if existing is not None:
        if existing.request_hash != digest:
            return Response(422, _err("idempotency_error", "key reused with different parameters"))
        return Response(existing.response_status or 200, dict(existing.response_body or {}))
    charge = Charge.objects.filter(charge_id=charge_id, kind="charge").first()
    if charge is not None and not _same_owner(charge.key, key):
        charge = None  # another owner's charge does not exist for this caller
    now = timezone.now()
    with transaction.atomic():
        if charge is None:
            status, response = 404, _err("resource_missing", f"no charge {charge_id}")
        else:
            refund = Charge.objects.create(
                charge_id=f"re_{secrets.token_hex(8)}",
                key=key,
                account=charge.account,
                amount_cents=-charge.amount_cents,
                kind="refund",
                refunds=charge.charge_id,
                fencing_token=fencing_token,
                created_at=now,
            )
            status = 200
            response = {"id": refund.charge_id, "object": "refund", "charge": charge_id}
        PaymentRequest.objects.create(
            key=key,
            request_hash=digest,
            status="done",
            response_status=status,
            response_body=response,
            fencing_token=fencing_token,
            created_at=now,
        )
    return Response(status, response)


def payments_prune(now: Any = None) -> int:
    """Keys older than 24 hours may be forgotten; a later reuse starts a new request."""
    cutoff = (now or timezone.now()) - KEY_RETENTION
    deleted, _ = PaymentRequest.objects.filter(created_at__lt=cutoff, status="done").delete()
    return int(deleted)


# --- inventory: answers lookups by key ----------------------------------------------------


def inventory_reserve(*, key: str, sku: str, qty: int, fencing_token: int) -> Response:
    """Reserve (no dedupe: the lookup contract). A request under an older fencing token than the
    newest seen for the key is refused, so a holder whose lease was taken over cannot add a
    second reservation after the new holder looked and acted."""
    with transaction.atomic():
        if not fence_admits_txn("inventory", key, fencing_token):
            return _stale_fence()
        reservation = Reservation.objects.create(
            reservation_id=f"rsv_{secrets.token_hex(8)}",
            key=key,
            sku=sku,
            qty=qty,
            fencing_token=fencing_token,
            created_at=timezone.now(),
        )
    return Response(200, _reservation(reservation))


def inventory_lookup(*, key: str, fencing_token: int | None = None) -> Response:
    """What was reserved under the key. A holder that looks up first also records its token,
    so an older holder cannot act after this lookup found nothing."""
    if fencing_token is not None:
        with transaction.atomic():
            if not fence_admits_txn("inventory", key, fencing_token):
                return _stale_fence()
    reservation = Reservation.objects.filter(key=key).order_by("created_at").first()
    if reservation is None:
        return Response(404, _err("not_found", "nothing reserved under this key"))
    return Response(200, _reservation(reservation))


def inventory_release(*, key: str, reservation_id: str) -> Response:
    held = Reservation.objects.filter(reservation_id=reservation_id).values_list("key", flat=True)
    if not any(_same_owner(k, key) for k in held):
        return Response(404, _err("not_found", f"no reservation {reservation_id}"))
    touched = Reservation.objects.filter(reservation_id=reservation_id).update(released=True)
    if not touched:
        return Response(404, _err("not_found", f"no reservation {reservation_id}"))
    return Response(200, {"id": reservation_id, "released": True})


def _reservation(r: Reservation) -> dict[str, Any]:
    return {"id": r.reservation_id, "sku": r.sku, "qty": r.qty, "released": r.released}


# --- notify: no contract ------------------------------------------------------------------


def notify_send(*, key: str, to: str, message: str) -> Response:
    note = Notification.objects.create(key=key, to=to, message=message, created_at=timezone.now())
    return Response(200, {"id": note.pk, "delivered": True})


# --- slow: a call that takes time ----------------------------------------------------------


# The slow receiver's two writes as SQL of their own (runtime/sql/sandbox.sql says why): the
# same rows, the same two commits.
_SQL = queries("slow_call_start", "slow_call_end", slots={})


def slow_call(
    *, key: str, seconds: float, fencing_token: int, deadline_remaining: float | None
) -> Response:
    """Record the start (with the deadline time the caller passed on), take ``seconds``, record
    the end. The sleep is the receiver's work: it does not listen to anyone meanwhile."""

    at = connection.ops.adapt_datetimefield_value  # as the ORM stores a time, on each backend
    with connection.cursor() as cur:
        cur.execute(
            _SQL["slow_call_start"], [key, fencing_token, deadline_remaining, at(timezone.now())]
        )
        row = fetchone_named(cur)
    assert row is not None  # INSERT ... RETURNING returns its row
    call_id = row["id"]
    time.sleep(seconds)
    with connection.cursor() as cur:
        cur.execute(_SQL["slow_call_end"], [at(timezone.now()), call_id])
    return Response(200, {"id": call_id})


def slow_wait_start(*, key: str, fencing_token: int, deadline_remaining: float | None) -> int:
    """The waiting receiver's first half (demo.slow_wait): record the call's start, as
    ``slow_call`` does, and return its id; the caller waits, then calls ``slow_wait_end``."""
    at = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cur:
        cur.execute(
            _SQL["slow_call_start"], [key, fencing_token, deadline_remaining, at(timezone.now())]
        )
        row = fetchone_named(cur)
    assert row is not None  # INSERT ... RETURNING returns its row
    return int(row["id"])


def slow_calls_started(key_part: str) -> int:
    """How many calls this receiver has seen start under keys containing ``key_part`` (a task's
    id: its operations' keys carry it)."""
    return SlowCall.objects.filter(key__contains=key_part).count()


def slow_wait_end(call_id: int) -> Response:
    """Record the end of a call ``slow_wait_start`` began."""
    at = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cur:
        cur.execute(_SQL["slow_call_end"], [at(timezone.now()), call_id])
    return Response(200, {"id": call_id})


# --- the receivers' own view of what they committed ---------------------------------------

RECEIVERS = ("payments", "inventory", "notify", "slow")


def effects_under(receiver: str, key: str) -> list[dict[str, Any]]:
    if receiver == "payments":
        return [
            {
                "id": c.charge_id,
                "kind": c.kind,
                "account": c.account,
                "amount_cents": c.amount_cents,
                "refunds": c.refunds or None,
                "fencing_token": c.fencing_token,
                "at": c.created_at.isoformat(),
            }
            for c in Charge.objects.filter(key=key).order_by("created_at", "pk")
        ]
    if receiver == "inventory":
        return [
            {**_reservation(r), "fencing_token": r.fencing_token, "at": r.created_at.isoformat()}
            for r in Reservation.objects.filter(key=key).order_by("created_at", "pk")
        ]
    if receiver == "notify":
        return [
            {"id": n.pk, "to": n.to, "message": n.message, "at": n.created_at.isoformat()}
            for n in Notification.objects.filter(key=key).order_by("created_at", "pk")
        ]
    if receiver == "slow":
        return [
            {
                "id": c.pk,
                "fencing_token": c.fencing_token,
                "deadline_remaining": c.deadline_remaining,
                "started_at": c.started_at.isoformat(),
                "finished_at": c.finished_at.isoformat() if c.finished_at else None,
            }
            for c in SlowCall.objects.filter(key=key).order_by("started_at", "pk")
        ]
    raise KeyError(receiver)


def _err(code: str, message: str) -> dict[str, Any]:
    return {"error": {"type": code, "message": message}}
