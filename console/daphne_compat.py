"""Daphne serves HTTP through Twisted, whose ``Request`` parses every multipart POST itself before
the application sees it: it reads the whole body into memory, parses it into ``request.args``
(which daphne never uses), and answers a body it cannot parse with a bare ``400`` (no headers, no
body: outside the API's error contract, PITFALLS.md). Django parses uploads anyway, streaming
large files to disk. Twisted lets a request skip that (``parsePOSTFormSubmission=False``), and
daphne passes its constructor arguments through, so daphne's request class is told to skip it."""

from __future__ import annotations

import inspect
from typing import Any


def twisted_form_parsing_off() -> bool:
    """Patch daphne's request class once; False when daphne or the Twisted option is absent."""
    try:
        from daphne.http_protocol import WebRequest
        from twisted.web import http
    except ImportError:
        return False
    if getattr(WebRequest, "_form_parsing_off", False):
        return True
    if "parsePOSTFormSubmission" not in inspect.signature(http.Request.__init__).parameters:
        return False
    original = WebRequest.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parsePOSTFormSubmission", False)
        original(self, *args, **kwargs)

    WebRequest.__init__ = __init__  # type: ignore[method-assign]
    WebRequest._form_parsing_off = True  # type: ignore[attr-defined]
    return True
