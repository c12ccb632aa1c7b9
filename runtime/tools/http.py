"""HTTP tools declared without code (docs/tools.md): a worker calls the endpoint an admin declared,
through the address guard (runtime.tools.outbound, with the switch TOOL_ALLOW_PRIVATE_HOSTS).

Each call carries the operation's idempotency key in the header the receiver honours (declared;
``Idempotency-Key`` by default), the lease generation as a fencing token
(``X-Console-Fencing-Token``) and the operation's id (``X-Console-Operation``); its
parameters are the JSON body (for GET, the query string); the credential, if any, is opened
from its seal for the call only. The outcome is classified as every adapter's is: a 2xx is
success (its JSON body is the result), 408/409/425/429 and 5xx transient, another 4xx
permanent, a refused connection transient, and a timeout or a reset after the request was sent
``unknown``: the receiver may have acted, so the contract decides (a person for ``none``), with
the request as the invocation's evidence."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import connections

from runtime.address_guard import url_hint
from runtime.models.tools import DeclaredToolKind
from runtime.tools.base import InvocationContext, ToolFailure, ToolResult
from runtime.tools.declared import KINDS, Declared, secret_open
from runtime.tools.outbound import Answer, answer_check, http_request
from runtime.tracing import inject

log = logging.getLogger(__name__)

SWITCH = "TOOL_ALLOW_PRIVATE_HOSTS"
FENCING_HEADER = "X-Console-Fencing-Token"
OPERATION_HEADER = "X-Console-Operation"
# The most of an answer kept as the operation's result.
RESULT_LIMIT = 64 * 1024
_MAX_DEPTH = 64


class HttpTool(Declared):
    """One version of a declared HTTP tool (``definition``: url, method, idempotency_header,
    auth, timeout_seconds, lookup_url)."""

    # It waits on the network (issue 36 point 4: a worker process runs such calls side by side).
    io_bound = True

    def call(self, ctx: InvocationContext) -> ToolResult:
        definition = self.definition
        answer, evidence = self._send(ctx, definition["method"], definition["url"], ctx.params)
        try:
            answer_check(answer)
        except ToolFailure as failure:
            failure.receipt = {**evidence, "status": answer.status, "answer": _text(answer)}
            raise
        return ToolResult(
            result=_result(answer),
            usage={"tool_calls": 1},
            receipt={**evidence, "status": answer.status},
        )

    def ask(self, ctx: InvocationContext) -> ToolResult | None:
        """GET ``lookup_url`` with the key: a 2xx is the effect found (its JSON the result), 404
        "nothing happened under this key"; anything else cannot tell yet (transient)."""
        answer, evidence = self._send(ctx, "GET", self.definition["lookup_url"], None)
        if answer.status == 404:
            return None
        if not 200 <= answer.status < 300:
            raise ToolFailure(
                ToolFailure.TRANSIENT,
                f"the lookup answered {answer.status}: {_text(answer)[:200]}",
                receipt={**evidence, "status": answer.status},
            )
        return ToolResult(result=_result(answer), receipt={**evidence, "status": answer.status})

    def _send(
        self, ctx: InvocationContext, method: str, url: str, params: dict[str, Any] | None
    ) -> tuple[Answer, dict[str, Any]]:
        definition = self.definition
        timeout = float(definition["timeout_seconds"])
        remaining = ctx.remaining_seconds()
        if remaining is not None:
            if remaining <= 0:
                raise ToolFailure(ToolFailure.PERMANENT, "the operation's deadline has passed")
            timeout = min(timeout, remaining)
        headers = {
            "Accept": "application/json",
            "User-Agent": "agent-console-tool/1",
            definition["idempotency_header"]: ctx.idempotency_key,
            FENCING_HEADER: str(ctx.fencing_token),
            OPERATION_HEADER: ctx.operation_id,
            **self._auth(),
        }
        # The receiver continues the agent's trace (traceparent: runtime.tracing), when on.
        inject(headers)
        body = None
        if params is not None and method == "GET":
            url = _with_query(url, params)
        elif params is not None:
            body = json.dumps(params, sort_keys=True, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        # What a person reads on the invocation, whatever comes back (never the credential, nor
        # the URL's path and query, which may carry one).
        evidence = {
            "tool_version": self.version,
            "method": method,
            "endpoint": url_hint(url),
            "idempotency_key": ctx.idempotency_key,
            "fencing_token": ctx.fencing_token,
            "at": datetime.now(UTC).isoformat(),
        }
        with _lease_kept(ctx, timeout):
            try:
                answer = http_request(
                    method,
                    url,
                    body=body,
                    headers=headers,
                    timeout=timeout,
                    switch=SWITCH,
                    limit=RESULT_LIMIT,
                )
            except ToolFailure as failure:
                failure.receipt = {**evidence, "error": failure.message}
                raise
        return answer, evidence

    def _auth(self) -> dict[str, str]:
        auth = self.definition.get("auth") or {}
        kind = auth.get("type", "none")
        if kind == "none" or not self.secret_sealed:
            return {}
        secret = secret_open(self.secret_sealed)
        if kind == "bearer":
            return {"Authorization": f"Bearer {secret}"}
        return {str(auth["header"]): secret}


KINDS[DeclaredToolKind.HTTP] = HttpTool


@contextmanager
def _lease_kept(ctx: InvocationContext, timeout: float) -> Iterator[None]:
    """Heartbeat the lease while a call that may outlast a third of it waits for its answer (a
    blocked socket read cannot heartbeat itself): otherwise the sweeper would take the
    operation over and call again while this call is still out. A cancel is the cancel watch's
    to act on (runtime.stopping), not this one's."""
    every = float(settings.LEASE_SECONDS) / 3
    if timeout <= every:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(every):
                ctx.heartbeat()
        except Exception:
            log.warning("heartbeat of %s failed", ctx.operation_id, exc_info=True)
        finally:
            connections.close_all()  # this thread's own connections

    thread = threading.Thread(target=beat, name=f"heartbeat-{ctx.operation_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _with_query(url: str, params: dict[str, Any]) -> str:
    """The parameters as a query string: text, numbers and booleans as they read, anything else
    as its JSON."""
    pairs = []
    for key, value in sorted(params.items()):
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str | int | float):
            text = str(value)
        else:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"))
        pairs.append((key, text))
    if not pairs:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode(pairs)}"


def _text(answer: Answer) -> str:
    return answer.body.decode("utf-8", "replace")[:500].replace("\x00", "\ufffd")


def _result(answer: Answer) -> Any:
    """A 2xx answer as the operation's result: its JSON; ``{"status", "text"}`` for an answer
    that is not JSON (or not JSON the database can store); nothing for an empty one."""
    if not answer.complete:
        return {
            "status": answer.status,
            "note": f"the answer was longer than {RESULT_LIMIT} bytes: not kept",
        }
    if not answer.body.strip():
        return None
    try:
        document = json.loads(answer.body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        document = None
    else:
        if _storable(document):
            return document
    return {"status": answer.status, "text": _text(answer)}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _storable(document: Any) -> bool:
    """Whether PostgreSQL's jsonb stores it as it is (no NUL, no lone surrogate, finite numbers,
    a bounded depth): the same rule as the API's request bodies."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if "\x00" in value or not _utf8(value):
                return False
        elif isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, dict | list):
            if depth > _MAX_DEPTH:
                return False
            items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
            for key, item in items:
                if key is not None:
                    stack.append((key, depth))
                stack.append((item, depth + 1))
    return True


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
