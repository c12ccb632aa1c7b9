"""The ``Idempotency-Key`` header on POSTs. The handler runs inside the request's durable
transaction together with the stored response, so either both commit or neither does (except
for handlers that call receivers, which must not hold a transaction: see ``idempotent``)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from django.db import transaction
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.auth import actor_of
from runtime.errors import DomainError
from runtime.hashing import canonical_json
from runtime.idempotent_requests import (
    Replay,
    request_abandon,
    request_begin,
    request_claim_txn,
    request_finish_txn,
    request_in_one_commit,
    request_record_txn,
)
from runtime.lease_tokens import lease_token_placeholder
from runtime.models import IdempotentRequest

Handler = Callable[..., Response]


@contextlib.contextmanager
def _no_transaction() -> Iterator[None]:
    yield


def _body_hash(request: Request) -> str:
    data: Any = request.data
    if hasattr(data, "lists"):  # a QueryDict from a form or multipart body
        data = {k: v for k, v in data.lists()}
        for name, upload in request.FILES.items():
            digest = hashlib.sha256()
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)
            data[name] = {"file_sha256": digest.hexdigest(), "name": upload.name}
    try:
        text = canonical_json(data)
    except TypeError:
        text = repr(data)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _storable(response: Response) -> Any:
    """The response body as stored for replays: a lease token becomes its placeholder (the
    replay derives it again), so the record holds no secret."""
    return json.loads(JSONRenderer().render(lease_token_placeholder(response.data)) or b"null")


def idempotent(handler: Handler | None = None, *, atomic: bool = True) -> Any:
    """Wrap a DRF POST handler in the request's durable transaction. With the header, the first
    response is stored in that transaction and replayed later.

    ``atomic=False`` is for handlers whose service calls a receiver (a lookup resolution): no
    remote call may run inside a transaction, so the service opens its own after the call and
    the response is stored in a short transaction of its own once the service committed. The
    service must then be safe to run again (a guarded transition on the version the caller
    read): a process that dies in between leaves the key in progress, and once that record is
    abandoned a retry runs the request again and is refused by the guard.

    A domain refusal still commits: services roll back their own writes (each runs in its own
    atomic block), so what remains is only what they chose to keep, such as the record of a
    rejected stale report. The refusal is then raised to the error mapping, and it does not
    burn the idempotency key.
    """

    if handler is None:
        return functools.partial(_wrap, atomic=atomic)
    return _wrap(handler, atomic=atomic)


def _wrap(handler: Handler, *, atomic: bool) -> Handler:
    @functools.wraps(handler)
    def wrapper(self: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is not None and atomic and request_in_one_commit():
            return _in_one_commit(handler, self, request, key, *args, **kwargs)
        begun: IdempotentRequest | None = None
        if key is not None:
            claimed = request_begin(
                principal=actor_of(request).key,
                key=key,
                method=request.method or "POST",
                path=request.path,
                body_hash=_body_hash(request),
            )
            if isinstance(claimed, Replay):
                replay = Response(claimed.body, status=claimed.status)
                replay["Idempotent-Replayed"] = "true"
                return replay
            begun = claimed
        try:
            with transaction.atomic(durable=True) if atomic else _no_transaction():
                answer = _answer_recorded(handler, self, request, begun, *args, **kwargs)
        except BaseException:
            if begun is not None:
                request_abandon(begun)
            raise
        return _answer_closed(begun, answer)

    return wrapper


def _answer_recorded(
    handler: Handler,
    view: Any,
    request: Request,
    begun: IdempotentRequest | None,
    *args: Any,
    **kwargs: Any,
) -> Response | DomainError:
    """The handler's answer, a 2xx one stored for replays under ``begun``; a domain refusal is
    returned, not raised, so that what its service chose to keep commits."""
    try:
        response = handler(view, request, *args, **kwargs)
    except DomainError as exc:
        return exc
    if begun is not None and 200 <= response.status_code < 300:
        body = _storable(response)
        with transaction.atomic():
            request_finish_txn(begun, response.status_code, body)
    return response


def _answer_closed(begun: IdempotentRequest | None, answer: Response | DomainError) -> Response:
    """The response, once a key whose request was refused or not a success is given up (a
    refusal does not burn it); a refusal raised to the error mapping."""
    if isinstance(answer, DomainError):
        if begun is not None:
            request_abandon(begun)
        raise answer
    if begun is not None and not 200 <= answer.status_code < 300:
        request_abandon(begun)
    return answer


def _in_one_commit(
    handler: Handler, view: Any, request: Request, key: str, *args: Any, **kwargs: Any
) -> Response:
    """PostgreSQL: the key is taken, the handler runs and the response is stored in one
    transaction, so an ``Idempotency-Key`` adds statements but no commit to the request."""
    identity = {
        "principal": actor_of(request).key,
        "key": key,
        "method": request.method or "POST",
        "path": request.path,
        "body_hash": _body_hash(request),
    }
    refusal: DomainError | None = None
    with transaction.atomic(durable=True):
        claimed = request_claim_txn(**identity)
        if isinstance(claimed, Replay):
            replay = Response(claimed.body, status=claimed.status)
            replay["Idempotent-Replayed"] = "true"
            return replay
        try:
            response = handler(view, request, *args, **kwargs)
        except DomainError as exc:
            # What the service chose to keep (a rejected report's record) still commits; the
            # key is not burned: no record is written for a refusal.
            refusal = exc
        else:
            if 200 <= response.status_code < 300:
                body = _storable(response)
                request_record_txn(claimed, status=response.status_code, body=body, **identity)
    if refusal is not None:
        raise refusal
    return response
