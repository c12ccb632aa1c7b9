"""The one mapping from errors to the contract's error body:
``{"error": {"code": "...", "message": "..."}}``."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DataError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from runtime.errors import DomainError

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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        headers = {}
        retry_after = exc.details.get("retry_after")
        if retry_after is not None:
            headers["Retry-After"] = str(int(retry_after))
        return Response(
            error_body(
                exc.code, exc.message, field=exc.details.get("field"), retry_after=retry_after
            ),
            status=exc.status,
            headers=headers,
        )
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "not found"), status=404)
    if isinstance(exc, DjangoPermissionDenied):
        return Response(error_body("not_authorized", "not authorized"), status=403)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("request_too_large", str(exc)), status=413)
    if isinstance(exc, SuspiciousOperation):
        # Django's own refusals of a request (too many fields, a bad multipart body): without
        # this they reach Django's HTML 400 page instead of the contract's error body.
        return Response(error_body("malformed_request", "the request is malformed"), status=400)
    if isinstance(exc, DataError):
        # The database refused a value the request carried (out of range, unstorable text).
        # Parsing should have refused it first: log the gap, answer as the malformed input it is.
        log.warning("database refused request data: %s", exc)
        return Response(error_body("invalid_input", "a value cannot be stored"), status=400)
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
    from django.http import JsonResponse

    return JsonResponse(error_body("not_found", "not found"), status=status.HTTP_404_NOT_FOUND)
