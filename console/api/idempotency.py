"""The ``Idempotency-Key`` header on POSTs. The handler runs inside the request's durable
transaction together with the stored response, so either both commit or neither does."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.db import transaction
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.auth import actor_of
from runtime.hashing import canonical_json
from runtime.idempotent_requests import Replay, request_abandon, request_begin, request_finish_txn

Handler = Callable[..., Response]


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


def idempotent(handler: Handler) -> Handler:
    """Wrap a DRF POST handler. Without the header the handler runs in a durable transaction of
    its own; with it, the first response is stored and replayed."""

    @functools.wraps(handler)
    def wrapper(self: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            with transaction.atomic(durable=True):
                return handler(self, request, *args, **kwargs)
        begun = request_begin(
            principal=actor_of(request).key,
            key=key,
            method=request.method or "POST",
            path=request.path,
            body_hash=_body_hash(request),
        )
        if isinstance(begun, Replay):
            response = Response(begun.body, status=begun.status)
            response["Idempotent-Replayed"] = "true"
            return response
        try:
            with transaction.atomic(durable=True):
                response = handler(self, request, *args, **kwargs)
                if 200 <= response.status_code < 300:
                    body = json.loads(JSONRenderer().render(response.data) or b"null")
                    request_finish_txn(begun, response.status_code, body)
                else:
                    raise _Refused(response)
        except _Refused as refused:
            request_abandon(begun)
            return refused.response
        except BaseException:
            request_abandon(begun)
            raise
        return response

    return wrapper


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        super().__init__("refused")
        self.response = response
