"""Log formats: human-readable lines by default, one JSON object per line with
``LOG_FORMAT=json`` (structlog's formatter over the standard library's records, so every logger,
Django's, Celery's and uvicorn's included, is formatted alike). Either way a line written while
a piece of work is bound (runtime.logcontext) carries its ids."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Callable
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse
from structlog.contextvars import get_contextvars, merge_contextvars

from runtime.logcontext import WORK_IDS, work_bind, work_clear


class PlainFormatter(logging.Formatter):
    """The human-readable line, with the bound ids of the work it is about at its end."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        bound = get_contextvars()
        ids = " ".join(f"{k}={bound[k]}" for k in WORK_IDS if k in bound)
        return f"{line} [{ids}]" if ids else line


def json_formatter() -> logging.Formatter:
    """One JSON object per record: timestamp, level, logger, event (the message), the bound
    ids, and the traceback as text when there is one."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
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


class WorkContextMiddleware:
    """A request about a task or an operation (an id in its route) binds that id for the log
    lines written while it is handled; views that load the operation bind its task and attempt
    too. Nothing stays bound from one request to the next (threads are reused)."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        work_clear()
        try:
            return self.get_response(request)
        finally:
            work_clear()

    def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: dict[str, Any]
    ) -> None:
        ids = {k: v for k, v in kwargs.items() if k in WORK_IDS}
        if ids:
            work_bind(**ids)
