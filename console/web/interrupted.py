"""A console form that cannot be acted on when it arrives (its session ended, its CSRF cookie is
gone) changes nothing, and the person must not be stranded: they are sent back to the page the
form was on, told that what they did was NOT taken, so they can take it again.

- Signed out: the login's ``next`` is that page with ``?not_taken=<the form's path>``; after the
  login (console.web.auth) the marker becomes a message and leaves the URL, and the page opens
  at the item the form was about (ANCHORS: the inbox at its request). What was typed in the
  form comes back from the tab's storage (static/console.js, data-keep). Without it the
  login sent the browser to GET the form's URL (a 405: the decision lost, the person stuck).
- A lost CSRF cookie: a redirect to that page with the same message (csrf_failure).

The page is the Referer when it is one of our own pages (it keeps the inbox's filters), else
the form's page by its route; the form's body is never read for it (console.edge answers from
the request's head)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.contrib import messages
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import Resolver404, resolve
from django.utils.http import url_has_allowed_host_and_scheme

NOT_TAKEN = "not_taken"

# Each console form's route: (the page it is on, what it would have done).
FORMS = {
    "approval-decide": ("/approvals/", "your decision on request {approval_id}"),
    "approval-edit": ("/approvals/", "your edit of request {approval_id}"),
    "approvals-bulk": ("/approvals/", "your decision on the selected requests"),
    "unresolved-resolve": ("/unresolved/", "your resolution of operation {operation_id}"),
    "unresolved-bulk": ("/unresolved/", "your resolution of the selected operations"),
    "work-action": ("/{queue}/", "your take, hand-over, release or comment on {operation_id}"),
    "wait-action": ("/waits/", "your action on the expired wait {operation_id}"),
    "task-cancel": ("/tasks/{task_id}/", "the cancellation of task {task_id}"),
    "task-control": ("/tasks/{task_id}/", "your pause, resume or steer of task {task_id}"),
    "tokens": ("/tokens/", "the token you asked for"),
    "token-revoke": ("/tokens/", "the revocation of the token"),
    "schedule-new": ("/schedules/", "the schedule you created"),
    "notification-email-test": ("/settings/notifications/", "your test e-mail"),
    "notification-endpoint-test": ("/settings/notifications/", "your test post"),
}
# The anchor of the item a form was about, on the page it comes back to: the inbox opens at the
# request (templates/console/_approval_rows.html), not at the top of thirty cards.
ANCHORS = {
    "approval-decide": "request-{approval_id}",
    "approval-edit": "request-{approval_id}",
}
# Routes that are no page to come back to.
_NOT_PAGES = frozenset(FORMS) | {"login", "logout"}

REASONS = {
    "signed_out": "You were signed out before it arrived",
    "csrf": "The page's form had expired (its security cookie was missing)",
}


class SeeOther(HttpResponseRedirect):
    """303: the browser fetches the page with GET, whatever method the form used."""

    status_code = 303


def _form(path: str) -> tuple[str, str] | None:
    """(page, what it would have done) for a console form's path, or None."""
    try:
        match = resolve(path)
    except Resolver404:
        return None
    known = FORMS.get(match.url_name or "")
    if known is None:
        return None
    page, what = known
    return page.format(**match.kwargs), what.format(**match.kwargs)


def anchor_of(path: str) -> str:
    """The anchor (without #) of the item the console form at ``path`` acts on, or ""."""
    try:
        match = resolve(path)
    except Resolver404:
        return ""
    anchor = ANCHORS.get(match.url_name or "")
    return anchor.format(**match.kwargs) if anchor else ""


def _anchored(url: str, anchor: str) -> str:
    """``url`` opening at ``anchor``, unless it already names one."""
    parts = urlsplit(url)
    if parts.fragment or not anchor:
        return url
    return urlunsplit((*parts[:4], anchor))


def _own_page(request: HttpRequest, url: str) -> str | None:
    """The path and query of ``url`` when it is one of this console's pages, else None."""
    try:
        host = request.get_host()
    except DisallowedHost:
        return None
    if not url_has_allowed_host_and_scheme(url, {host}, require_https=request.is_secure()):
        return None
    parts = urlsplit(url)
    if not parts.path.startswith("/") or parts.path.startswith(("/api/", "/static/")):
        return None
    try:
        match = resolve(parts.path)
    except Resolver404:
        return None
    if match.url_name in _NOT_PAGES:
        return None
    return urlunsplit(("", "", parts.path, parts.query, ""))


def return_page(request: HttpRequest) -> str:
    """Where the person was when they sent the form: the Referer when it is our own page, else
    the form's page, else the dashboard."""
    referer = _own_page(request, request.headers.get("Referer", ""))
    if referer:
        return referer
    form = _form(request.path)
    return form[0] if form else "/"


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    return urlunsplit(("", "", parts.path, urlencode([*query, *params.items()], safe="/"), ""))


def login_next(request: HttpRequest) -> str:
    """The login's ``next`` for an anonymous request: the page itself for a GET; for a form,
    the page it was on, marked so the login says it was not taken."""
    if request.method in ("GET", "HEAD"):
        return request.get_full_path()
    return _with_query(return_page(request), **{NOT_TAKEN: request.path})


def not_taken_message(form_path: str, reason: str) -> str:
    form = _form(form_path)
    what = form[1] if form else "what you sent"
    return (
        f"{REASONS[reason]}, so {what} was NOT taken. Nothing has changed: "
        "take it again below if you still want it."
    )


def after_login(url: str, request: HttpRequest) -> str:
    """The login's destination without its marker; the marker becomes a message."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    marked = [v for k, v in query if k == NOT_TAKEN]
    if not marked:
        return url
    messages.warning(request, not_taken_message(marked[0], "signed_out"), fail_silently=True)
    kept = urlencode([(k, v) for k, v in query if k != NOT_TAKEN])
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, kept, parts.fragment))
    return _anchored(url, anchor_of(marked[0]))


def form_expired(request: HttpRequest) -> HttpResponseRedirect:
    """A page form refused by the CSRF check: nothing was done; back to the page it was on with
    a message (the page sets a fresh cookie). The login form goes back to the login."""
    if resolve_name(request.path) == "login":
        messages.warning(
            request,
            "The log-in form had expired (its security cookie was missing). Log in again.",
            fail_silently=True,
        )
        target = str(request.POST.get("next", "/"))
        if not url_has_allowed_host_and_scheme(target, set()):
            target = "/"
        return SeeOther(_with_query("/login/", next=target))
    messages.warning(request, not_taken_message(request.path, "csrf"), fail_silently=True)
    return SeeOther(_anchored(return_page(request), anchor_of(request.path)))


def resolve_name(path: str) -> str | None:
    try:
        return resolve(path).url_name
    except Resolver404:
        return None
