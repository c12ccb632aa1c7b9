"""``Idempotency-Key`` for POSTs (the IETF draft's semantics): the first response is stored and
replayed; the same key with another body is refused; a request still in progress is refused.
The unique constraint on (principal, key) is the arbiter between concurrent first requests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from runtime import dialect
from runtime.db import fetchone_named, prepared_cursor
from runtime.errors import IdempotencyKeyReused, InvalidInput, RequestInProgress, StaleLease
from runtime.lease_tokens import lease_token_restore
from runtime.models import IdempotentRequest
from runtime.sqlfiles import column_list, queries

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
    """Claim the key for a first request, or return the stored response to replay. The record
    is written (in progress) and committed at once, before the request runs: for a request that
    runs outside one transaction (a handler that calls a receiver), and on SQLite."""
    if not _valid_key(key):
        raise InvalidInput("Idempotency-Key must be 1 to 255 printable ASCII characters")
    identity = {"method": method, "path": path, "body_hash": body_hash}
    if request_in_one_commit():
        # PostgreSQL: under the key's advisory lock, as a request run in one commit takes it
        # (request_claim_txn). That request writes its record only with its response, so
        # without the lock this record could be written while it runs, and one key would
        # carry two requests: both would act, and its own record's insert would fail (a 500).
        with transaction.atomic():
            claimed = request_claim_txn(principal=principal, key=key, **identity)
            if claimed is not None:
                return claimed
            return IdempotentRequest.objects.create(principal=principal, key=key, **identity)
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


def request_in_one_commit() -> bool:
    """Whether keys can be taken inside the request's own transaction (PostgreSQL's
    transaction-scoped advisory locks); elsewhere the key's record is claimed in a short
    transaction of its own first."""
    return dialect.advisory_locks()


def request_claim_txn(
    *, principal: str, key: str, method: str, path: str, body_hash: str
) -> IdempotentRequest | Replay | None:
    """Inside the request's own transaction (PostgreSQL): take the key for this transaction, or
    answer from its record. The key is held by a transaction-scoped advisory lock, so a second
    request under the same key while this one runs is refused at once (409) instead of waiting,
    and the record is written only with the response, in the same commit as the business write:
    the key costs no commit of its own. Returns None (or an abandoned record to finish) when the
    request should run, a Replay when it ran before.

    Preconditions: on PostgreSQL, inside the request's ``atomic(durable=True)`` (or the short
    transaction in which ``request_begin`` writes its record under the same lock)."""
    if not _valid_key(key):
        raise InvalidInput("Idempotency-Key must be 1 to 255 printable ASCII characters")
    # One round trip: the lock, then the record read in a snapshot taken once the lock is held
    # (migration 0017 says why that needs a function).
    with prepared_cursor() as cur:
        cur.execute(_SQL["idempotency_claim"], [principal, key])
        row = fetchone_named(cur)
    if not (row and row["taken"]):
        raise RequestInProgress("a request with this Idempotency-Key is still in progress")
    existing = _record_of(row)
    if existing is None:
        return None
    return _replay_or_refuse(existing, method=method, path=path, body_hash=body_hash)


def request_record_txn(
    record: IdempotentRequest | None,
    *,
    principal: str,
    key: str,
    method: str,
    path: str,
    body_hash: str,
    status: int,
    body: Any,
) -> None:
    """Store the first response, inside the transaction that made it (see request_claim_txn)."""
    if record is not None:
        request_finish_txn(record, status, body)
        return
    now = timezone.now()
    row = (Jsonb(body), now, now)
    with prepared_cursor() as cur:
        cur.execute(
            _SQL["idempotency_record"],
            (principal, key, method, path, body_hash, IdempotentRequest.STATUS_DONE, status, *row),
        )


# The PostgreSQL path's two statements (the claim's function call, the record's insert), bound on
# the server (runtime.db.prepared_cursor): every POST with a key runs them, and the ORM's
# compiling of each was a tenth of a proposal's CPU.
_FIELDS = [
    "id",
    "principal",
    "key",
    "method",
    "path",
    "body_hash",
    "status",
    "response_status",
    "response_body",
    "created_at",
    "finished_at",
]
# The statements, in runtime/sql/requests.sql; the claim returns the record's _FIELDS.
_SQL = queries(
    "idempotency_claim",
    "idempotency_record",
    slots={"record_columns": column_list(tuple(f'"{name}"' for name in _FIELDS), "(c.existing)")},
)


def _record_of(row: dict[str, Any]) -> IdempotentRequest | None:
    """The record from its _FIELDS columns, by name; None for the claim's no-record (a NULL
    id)."""
    if row["id"] is None:
        return None
    values = [row[name] for name in _FIELDS]
    body = _FIELDS.index("response_body")
    if isinstance(values[body], str):  # Django's connections load jsonb as text
        values[body] = json.loads(values[body])
    return IdempotentRequest.from_db(DEFAULT_DB_ALIAS, _FIELDS, values)


def _replay_or_refuse(
    existing: IdempotentRequest, *, method: str, path: str, body_hash: str
) -> IdempotentRequest | Replay:
    if existing.body_hash != body_hash or existing.path != path or existing.method != method:
        raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
    if existing.status == IdempotentRequest.STATUS_DONE:
        # A stored response keeps no secret: its lease tokens are derived again here.
        body, whole = lease_token_restore(existing.response_body)
        if not whole:
            raise StaleLease("the key that signed this claim's lease token was retired")
        return Replay(existing.response_status or 200, body)
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
    """Store the response inside the transaction that made it, so both commit or neither.
    Preconditions: ``body`` holds no secret (lease tokens as their placeholders:
    ``lease_tokens.lease_token_placeholder``)."""
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
