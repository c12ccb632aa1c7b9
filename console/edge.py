"""Who is asking, known from a request's head before any of its body is read, and how much body
each route may send. console.asgi asks ``admit`` for every request that has a body (a
Content-Length above 0, or chunked) before it receives a byte of it:

- a route that needs a principal (all but PUBLIC_ROUTES) is answered at once, without reading,
  when the head names nobody: a bearer token (verified by the API's own authentication class)
  or a session cookie of an active user. The answer is the one the view gives an anonymous
  caller: the API's 401 (or 429 from the token limiter), a page's redirect to the login;
- a body declared larger than its route's limit is a 413 before it is read, and one that grows
  past the limit while it arrives (chunked) is cut off with a 413 there;
- a path that names no route is answered as Django answers it, without reading the body.

The principal found here is handed to the request, so the view does not verify it twice (and
the token limiter counts each attempt once)."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.views import redirect_to_login
from django.core.handlers.asgi import ASGIRequest, get_script_prefix
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, ResolverMatch, resolve
from rest_framework import exceptions, parsers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from console.api.auth import BearerTokenAuthentication
from console.api.errors import exception_handler
from console.middleware import is_api, refusal
from console.web.interrupted import login_next
from runtime.errors import DomainError

# Routes anyone may send a (small) body to: logging in must read its form; the rest ignore it.
PUBLIC_ROUTES = frozenset({"healthz", "schema", "docs", "login", "logout"})
# An upload's multipart framing around the file: boundaries, part headers, the small fields.
MULTIPART_OVERHEAD = 64 * 1024
DEFAULT_BODY_LIMIT = 2_621_440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE default (2.5 MiB)

Answer = Callable[[HttpRequest], HttpResponse]


@dataclass(frozen=True)
class Framing:
    """How the head says a body follows: its declared length, or chunked (length unknown)."""

    declared: int | None
    chunked: bool


@dataclass(frozen=True)
class Admission:
    """What the head decided: at most ``limit`` bytes of body may be read (None: no limit), or
    (``refused``) none is, and ``answer`` is sent instead (None: the chain's own answer, for a
    path no view serves); the principal found for the view."""

    limit: int | None
    upload: bool = False
    refused: bool = False
    answer: Answer | None = None
    bearer: tuple[Any, Any] | None = None  # (user, auth) as DRF's authentication returns it
    user: Any = None  # the session's user, verified


def framing(scope: dict[str, Any]) -> Framing | None:
    """The body the head announces, or None when it announces none."""
    declared: int | None = None
    chunked = False
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            # The server (h11) refused a malformed or conflicting one already.
            declared = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    if chunked:
        return Framing(None, True)
    if declared:
        return Framing(declared, False)
    return None


def _route(scope: dict[str, Any]) -> ResolverMatch | None:
    path = scope["path"].removeprefix(get_script_prefix(scope))
    try:
        return resolve(path)
    except Resolver404:
        return None


def _body_limit(match: ResolverMatch) -> tuple[int | None, bool]:
    """(limit, is an upload): a view that parses multipart takes a file, up to
    ARTIFACT_MAX_BYTES; every other body (JSON, a page's form) is small."""
    view_class = getattr(match.func, "view_class", None) or getattr(match.func, "cls", None)
    parser_classes = getattr(view_class, "parser_classes", None) or []
    if any(issubclass(p, parsers.MultiPartParser) for p in parser_classes):
        return settings.ARTIFACT_MAX_BYTES + MULTIPART_OVERHEAD, True
    limit = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", DEFAULT_BODY_LIMIT)
    return limit, False


def route_admission(scope: dict[str, Any], body: Framing) -> tuple[Admission, bool]:
    """What the path alone decides (no database): the route's limit, and whether a principal
    must be found before the body is read."""
    match = _route(scope)
    if match is None:
        # No view: Django's own answer (404, or CommonMiddleware's redirect), body unread.
        return Admission(limit=0, refused=True), False
    limit, upload = _body_limit(match)
    admission = Admission(limit=limit, upload=upload)
    if body.declared is not None and limit is not None and body.declared > limit:
        admission = replace(admission, refused=True, answer=too_large(upload, limit))
    return admission, match.url_name not in PUBLIC_ROUTES


def admit(scope: dict[str, Any], admission: Admission) -> Admission:
    """The principal the head names, for a route that needs one (sync: it reads the database).
    Runs before the body is read; the connection it used goes back before the body arrives
    (an upload can take minutes)."""
    try:
        return _admit(scope, admission)
    finally:
        close_old_connections()


def _admit(scope: dict[str, Any], admission: Admission) -> Admission:
    head = ASGIRequest(scope, io.BytesIO())
    api = is_api(head)
    if api:
        try:
            bearer = BearerTokenAuthentication().authenticate(Request(head))
        except (exceptions.APIException, DomainError) as exc:
            return replace(admission, refused=True, answer=_api_refusal(exc))
        if bearer is not None:
            return replace(admission, bearer=bearer)
    user = _session_user(head)
    if user is not None:
        return replace(admission, user=user)
    # Nobody: what the view answers an anonymous caller, whatever the body would have said.
    answer = _api_refusal(exceptions.NotAuthenticated()) if api else _login
    return replace(admission, refused=True, answer=answer)


def _session_user(head: HttpRequest) -> Any:
    """The active user the session cookie stands for (Django's own check: the backend, the
    session's password hash), or None."""
    key = head.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not key:
        return None
    head.session = import_module(settings.SESSION_ENGINE).SessionStore(key)  # type: ignore[attr-defined]
    user = auth.get_user(head)
    return user if user.is_authenticated else None


def hand_over(request: HttpRequest, admission: Admission) -> None:
    """Give the view the principal found from the head, so it is not verified twice."""
    if admission.bearer is not None:
        # DRF's hook for an already authenticated request (its test client uses the same).
        request._force_auth_user, request._force_auth_token = admission.bearer  # type: ignore[attr-defined]
    elif admission.user is not None:
        # What AuthenticationMiddleware's lazy request.user returns when it is set.
        request._cached_user = admission.user  # type: ignore[attr-defined]


def _api_refusal(exc: Exception) -> Answer:
    def answer(request: HttpRequest) -> HttpResponse:
        response = exception_handler(exc, {})
        assert response is not None, exc
        response.accepted_renderer = JSONRenderer()
        response.accepted_media_type = "application/json"
        response.renderer_context = {}  # type: ignore[attr-defined]
        response.render()
        return response

    return answer


def _login(request: HttpRequest) -> HttpResponse:
    # As console_view answers: a form goes back to the page it came from, marked not taken
    # (never to GET the form's URL after the login).
    return redirect_to_login(login_next(request))


def too_large(upload: bool, limit: int | None) -> Answer:
    """413 in the contract's codes: an upload's is artifact_too_large (as the upload view says),
    any other body's request_too_large (as Django's own limit says)."""
    if upload:
        code = "artifact_too_large"
        message = f"the artifact is larger than {settings.ARTIFACT_MAX_BYTES} bytes"
    else:
        code = "request_too_large"
        message = f"the request body is larger than {limit} bytes"

    def answer(request: HttpRequest) -> HttpResponse:
        return refusal(request, 413, code, message)

    return answer
