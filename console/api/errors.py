"""The one mapping from errors to the contract's error body:
``{"error": {"code": "...", "message": "..."}}``."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DataError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from runtime.db import is_contention
from runtime.errors import DatabaseBusy, DomainError

log = logging.getLogger(__name__)

_DRF_CODES: list[tuple[type[Exception], int, str]] = [
    (exceptions.NotAuthenticated, 401, "not_authenticated"),
    (exceptions.AuthenticationFailed, 401, "not_authenticated"),
    (exceptions.PermissionDenied, 403, "not_authorized"),
    (exceptions.NotFound, 404, "not_found"),
    (exceptions.MethodNotAllowed, 405, "method_not_allowed"),
    (exceptions.NotAcceptable, 406, "not_acceptable"),
    (exceptions.UnsupportedMediaType, 415, "unsupported_media_type"),
    (exceptions.Throttled, 429, "throttled"),
    (exceptions.ParseError, 400, "malformed_request"),
    (exceptions.ValidationError, 400, "invalid_input"),
]


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    body.update({k: v for k, v in extra.items() if v is not None})
    return {"error": body}


def _validation_message(detail: Any) -> str:
    if isinstance(detail, dict):
        parts = []
        for field, value in detail.items():
            parts.append(f"{field}: {_validation_message(value)}")
        return "; ".join(parts)
    if isinstance(detail, list):
        return " ".join(_validation_message(v) for v in detail)
    return str(detail)


def as_domain(exc: BaseException) -> BaseException:
    """Database contention (runtime.db.is_contention) as the domain's DatabaseBusy: 503 with
    Retry-After instead of a 500, since the request's transaction rolled back whole."""
    if is_contention(exc):
        log.info("request rolled back by database contention: %s", exc)
        return DatabaseBusy("the database is busy with concurrent changes; retry shortly")
    return exc


def classify(exc: BaseException) -> tuple[int, str, str] | None:
    """(HTTP status, contract code, message) for an error a client can provoke, or None for a
    fault of ours. The one table shared by the REST API, the console pages (middleware) and the
    websocket consumers (close code 4000 + status)."""
    exc = as_domain(exc)
    if isinstance(exc, DomainError):
        return exc.status, exc.code, exc.message
    if isinstance(exc, Http404):
        return 404, "not_found", "not found"
    if isinstance(exc, DjangoPermissionDenied):
        return 403, "not_authorized", "not authorized"
    if isinstance(exc, RequestDataTooBig):
        return 413, "request_too_large", str(exc)
    if isinstance(exc, SuspiciousOperation):
        # Django's own refusals of a request (too many fields, a bad multipart body): without
        # this they reach Django's HTML 400 page instead of the contract's error body.
        return 400, "malformed_request", "the request is malformed"
    if isinstance(exc, DataError):
        # The database refused a value the request carried (out of range, unstorable text).
        # Parsing should have refused it first: log the gap, answer as the malformed input it is.
        log.warning("database refused request data: %s", exc)
        return 400, "invalid_input", "a value cannot be stored"
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    exc = as_domain(exc)  # type: ignore[assignment]
    known = classify(exc)
    if known is not None:
        code_status, code, message = known
        headers: dict[str, str] = {}
        extra: dict[str, Any] = {}
        if isinstance(exc, DomainError):
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                headers["Retry-After"] = str(retry_after)
            if getattr(exc, "public_details", False):
                extra = dict(exc.details)
            # A refusal about one field (not_supported_yet) names it.
            if "field" in exc.details:
                extra["field"] = exc.details["field"]
        return Response(error_body(code, message, **extra), status=code_status, headers=headers)
    for klass, code_status, code in _DRF_CODES:
        if isinstance(exc, klass):
            assert isinstance(exc, exceptions.APIException)
            if isinstance(exc, exceptions.ValidationError):
                message = _validation_message(exc.detail)
                return Response(error_body(code, message, fields=exc.detail), status=code_status)
            headers = {}
            if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
                headers["WWW-Authenticate"] = 'Bearer realm="api"'
            return Response(error_body(code, str(exc.detail)), status=code_status, headers=headers)
    if isinstance(exc, exceptions.APIException):
        return Response(error_body(str(exc.default_code), str(exc.detail)), status=exc.status_code)
    return None


def not_found_json(request: Any, exception: Any = None) -> Any:

    return JsonResponse(error_body("not_found", "not found"), status=status.HTTP_404_NOT_FOUND)
