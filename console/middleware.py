"""Request edges shared by the API and the console pages: text the database cannot store is
refused before any view runs, errors a client can provoke are mapped once (console.api.errors.
classify) whichever view raised them, and pages carry their security headers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import TooManyFilesSent
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.shortcuts import render

from console.api.errors import classify, error_body
from console.api.parsers import text_problem

Handler = Callable[[HttpRequest], HttpResponse]


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def refusal(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    """The error in the shape the caller reads: the contract's JSON under /api/ (and for
    fetches of page fragments' data), a page for people."""
    if is_api(request) or request.path == "/healthz":
        return JsonResponse(error_body(code, message), status=status)
    template = "console/not_found.html" if status == 404 else "console/error.html"
    return render(request, template, {"error": {"code": code, "message": message}}, status=status)


def _input_problem(request: HttpRequest) -> str | None:
    sources = [request.GET]
    # API bodies go through the strict parser; page forms are read here (CSRF reads them anyway).
    if request.method == "POST" and not is_api(request):
        sources.append(request.POST)
    for source in sources:
        for key, values in source.lists():
            for text in (key, *values):
                problem = text_problem(text)
                if problem:
                    return f"{key[:40]!r}: {problem}"
    return None


class InputEdgeMiddleware:
    """NUL characters and lone surrogates in a path, a query or a page form are refused with a
    400 here, so no view (API, page or fragment) hands them to PostgreSQL."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # console.asgi answered from the head alone (console.edge), the body unread: that answer,
        # with the headers the rest of the chain gives every response.
        early = getattr(request, "edge_answer", None)
        if early is not None:
            return early(request)  # type: ignore[no-any-return]
        if text_problem(request.path):
            # No id or route contains one: such a path names nothing, as any unknown path.
            return refusal(request, 404, "not_found", "not found")
        try:
            problem = _input_problem(request)
        except (MultiPartParserError, UnreadablePostError, TooManyFilesSent):
            # Django would let a malformed page form escape as a 500 from the CSRF check.
            return refusal(request, 400, "malformed_request", "the form body is malformed")
        if problem:
            return refusal(request, 400, "invalid_input", problem)
        return self.get_response(request)


class ErrorMappingMiddleware:
    """What page views raise (a domain refusal, a DataError the edge did not foresee) becomes a
    4xx page through the same table as the API's errors, rather than a 500. DRF views map their
    own errors (console.api.errors.exception_handler) before this sees them."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        known = classify(exception)
        if known is None:
            return None
        return refusal(request, *known)


# Console pages load script and style only from static/, open websockets only to this origin,
# and cannot be framed. No inline script or style: markup that slipped into a page cannot run.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Swagger UI (/api/docs/) inserts style elements at run time; its script stays 'self' only.
DOCS_CONTENT_SECURITY_POLICY = CONTENT_SECURITY_POLICY.replace(
    "style-src 'self'", "style-src 'self' 'unsafe-inline'"
)
PERMISSIONS_POLICY = ", ".join(
    f"{feature}=()"
    for feature in (
        "accelerometer",
        "camera",
        "geolocation",
        "gyroscope",
        "magnetometer",
        "microphone",
        "payment",
        "usb",
    )
)


class SecurityHeadersMiddleware:
    """Content-Security-Policy and Permissions-Policy on every response (JSON included: a
    response rendered by mistake as HTML still cannot run script)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = (
            DOCS_CONTENT_SECURITY_POLICY
            if request.path.startswith("/api/docs/")
            else CONTENT_SECURITY_POLICY
        )
        response.headers.setdefault("Content-Security-Policy", policy)
        response.headers.setdefault("Permissions-Policy", PERMISSIONS_POLICY)
        return response
