"""``Idempotency-Key`` for POSTs (the IETF draft's semantics): the first response is stored and
replayed; the same key with another body is refused; a request still in progress is refused.
The unique constraint on (principal, key) is the arbiter between concurrent first requests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runtime.errors import IdempotencyKeyReused, InvalidInput, RequestInProgress
from runtime.models import IdempotentRequest

# A first request that never finished (its process died before committing) stops blocking its
# key after this long. Its business write and its stored response commit together, so an
# unfinished record means nothing was written and running the request again is safe.
ABANDONED_AFTER = timedelta(seconds=60)


@dataclass(frozen=True)
class Replay:
    status: int
    body: Any


def _valid_key(key: str) -> bool:
    # The draft's key is a structured-field string: printable ASCII. Anything else (a NUL above
    # all) would fail in the database instead of being refused here.
    return 0 < len(key) <= 255 and all(" " <= ch <= "~" for ch in key)


def request_begin(
    *, principal: str, key: str, method: str, path: str, body_hash: str
) -> IdempotentRequest | Replay:
    """Claim the key for a first request, or return the stored response to replay."""
    if not _valid_key(key):
        raise InvalidInput("Idempotency-Key must be 1 to 255 printable ASCII characters")
    # A holder can free the key between our failed insert and our read (its request was
    # refused): then the key is free again and we try to claim it once more.
    for _ in range(3):
        try:
            with transaction.atomic():
                return IdempotentRequest.objects.create(
                    principal=principal, key=key, method=method, path=path, body_hash=body_hash
                )
        except IntegrityError:
            pass
        existing = IdempotentRequest.objects.filter(principal=principal, key=key).first()
        if existing is not None:
            return _replay_or_refuse(existing, method=method, path=path, body_hash=body_hash)
    raise RequestInProgress("a request with this Idempotency-Key is still in progress")


def _replay_or_refuse(
    existing: IdempotentRequest, *, method: str, path: str, body_hash: str
) -> IdempotentRequest | Replay:
    if existing.body_hash != body_hash or existing.path != path or existing.method != method:
        raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
    if existing.status == IdempotentRequest.STATUS_DONE:
        return Replay(existing.response_status or 200, existing.response_body)
    if timezone.now() - existing.created_at > ABANDONED_AFTER:
        touched = IdempotentRequest.objects.filter(
            pk=existing.pk,
            status=IdempotentRequest.STATUS_IN_PROGRESS,
            created_at=existing.created_at,
        ).update(created_at=timezone.now())
        if touched == 1:
            existing.refresh_from_db()
            return existing
    raise RequestInProgress("a request with this Idempotency-Key is still in progress")


def request_finish_txn(record: IdempotentRequest, status: int, body: Any) -> None:
    """Store the response inside the transaction that made it, so both commit or neither."""
    IdempotentRequest.objects.filter(pk=record.pk).update(
        status=IdempotentRequest.STATUS_DONE,
        response_status=status,
        response_body=body,
        finished_at=timezone.now(),
    )


def request_abandon(record: IdempotentRequest) -> None:
    """The request was refused before changing anything: free the key for a corrected retry."""
    IdempotentRequest.objects.filter(
        pk=record.pk, status=IdempotentRequest.STATUS_IN_PROGRESS
    ).delete()
