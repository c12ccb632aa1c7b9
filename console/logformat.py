"""Log formats: human-readable lines by default, one JSON object per line with
``LOG_FORMAT=json`` (structlog's formatter over the standard library's records, so every logger,
Django's, Celery's and uvicorn's included, is formatted alike). Either way a line written while
a piece of work or a request is bound (runtime.logcontext) carries its ids, and a line that
names fields of its own (a transition's: ``runtime.logcontext.LOG_FIELDS``) carries those,
over what is bound.

The web's request id (``RequestIdMiddleware``): an incoming ``X-Request-ID`` of a safe shape
is kept, otherwise one is made; it is bound for every line written while the request is
handled, returned in the response's ``X-Request-ID``, and published with the work the request
causes (runtime.publish puts it in the Celery message's headers; the worker binds it for that
delivery: runtime.worker)."""

from __future__ import annotations

import logging
import logging.config
import re
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse
from structlog.contextvars import get_contextvars, merge_contextvars

from runtime.logcontext import (
    LOG_FIELDS,
    WORK_IDS,
    request_bind,
    work_bind,
    work_clear,
    work_unbind,
)


class PlainFormatter(logging.Formatter):
    """The human-readable line, with the ids of the work it is about at its end: the record's
    own fields, else those bound."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {**get_contextvars(), **{k: v for k, v in vars(record).items() if k in _OWN}}
        ids = " ".join(f"{k}={fields[k]}" for k in LOG_FIELDS if k in fields)
        return f"{line} [{ids}]" if ids else line


# A record's own fields the line shows (the transition's name is already its message).
_OWN = frozenset(LOG_FIELDS) - {"transition"}


def json_formatter() -> logging.Formatter:
    """One JSON object per record: timestamp, level, logger, event (the message), the record's
    own fields and the bound ids, and the traceback as text when there is one."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            # A record's own fields first: the bound ones fill only what it does not name.
            structlog.stdlib.ExtraAdder(allow=LOG_FIELDS),
            merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )


def logging_configure(config: dict[str, Any]) -> None:
    """Django's LOGGING_CONFIG: the settings' LOGGING applied as Django's default does, and
    Python's warnings logged (``py.warnings``) instead of written to stderr as they are, so that
    under LOG_FORMAT=json a warning is a JSON line too (Django no longer captures them)."""
    logging.config.dictConfig(config)
    logging.captureWarnings(True)


Handler = Callable[[HttpRequest], HttpResponse]


REQUEST_ID_HEADER = "X-Request-ID"
# An incoming id is kept only in a shape that is safe in a log line and a header (no spaces,
# quotes or control characters) and short; anything else is replaced, not refused.
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=@-]{0,127}")


def request_id_of(request: HttpRequest) -> str:
    """The request's id: its ``X-Request-ID`` when of a safe shape, else a new one."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


class RequestIdMiddleware:
    """Binds the request's id (``request_id_of``) for every line written while it is handled
    and returns it in the response's ``X-Request-ID``. Before every other middleware, so that
    every line of the request carries it; what the request publishes carries it too
    (runtime.publish)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        work_clear()  # nothing of a request this thread served before stays bound
        request_id = request_id_of(request)
        request_bind(request_id)
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request_id
        # Left bound (until this context's next request clears it): Django logs a 4xx or 5xx
        # answer after the middleware returned, and the server its access line after the
        # response is closed. Under ASGI each request is a task with a context of its own, so
        # nothing of it reaches another request's lines.
        return response


class WorkContextMiddleware:
    """A request about a task or an operation (an id in its route) binds that id for the log
    lines written while it is handled; views that load the operation bind its task and attempt
    too. Nothing stays bound from one request to the next (threads are reused)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The work's ids bound here are the request's only; its request id (bound around this
        # by RequestIdMiddleware) stays for the lines written on its way out.
        try:
            return self.get_response(request)
        finally:
            work_unbind()

    def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: dict[str, Any]
    ) -> None:
        ids = {k: v for k, v in kwargs.items() if k in WORK_IDS}
        if ids:
            work_bind(**ids)
