"""Logs name the work (issue 40): each journal event is one INFO line once it commits, naming
the task, attempt, operation, execution and lease generation and the actor, whichever form of
the transition wrote it (the general writer, the one-statement form, the drainer's batch); a web
request's lines carry one request id, returned in ``X-Request-ID``, and the worker's lines for
the work the request caused carry the same."""

from __future__ import annotations

import io
import json
import logging
import uuid
from pathlib import Path

import httpx
import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from structlog.contextvars import bound_contextvars

from console.logformat import (
    PlainFormatter,
    RequestIdMiddleware,
    WorkContextMiddleware,
    json_formatter,
)
from runtime.executions import execution_for_agent
from runtime.models import Event, Operation
from runtime.transitions.accept_decision import Report
from tests import factories
from tests.conftest import server_start, wait_for
from tests.runtime.test_differential_paths import MODES, Driver, _due_now

TRANSIENT = Report(outcome="failed", error_kind="transient", message="try again")


def _journal_lines(caplog: pytest.LogCaptureFixture, operation_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "runtime.journal" and getattr(r, "operation_id", None) == operation_id
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", MODES)
def test_an_operation_that_fails_twice_then_succeeds_logs_each_transition_once(
    mode, settings, caplog
):
    settings.HOTPATH = mode != "general"
    settings.DRAIN_BATCH = 32 if mode == "batch" else 0
    caplog.set_level(logging.INFO, logger="runtime.journal")
    owner = factories.agent(f"logs-{mode}")
    driver = Driver(mode, execution_for_agent(f"worker-{mode}").pk)
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.echo", params={"v": 1})
    for report in (TRANSIENT, TRANSIENT, Report(outcome="succeeded", result={"v": 1})):
        (lease,) = driver.claim([op])
        driver.report([lease], [report])
        _due_now([op])
    assert Operation.objects.get(pk=op.pk).status == "succeeded"
    if mode == "batch":
        assert driver.batches, "the batch form was never taken"

    lines = _journal_lines(caplog, op.pk)
    journal = list(Event.objects.filter(operation_id=op.pk).order_by("seq"))
    # One line per event of the operation, in the journal's order: none missing, none twice.
    assert [r.transition for r in lines] == [e.type for e in journal]
    assert [r.actor for r in lines] == [e.actor for e in journal]
    assert [e.type for e in journal].count("operation.claimed") == 3
    for record in lines:
        assert record.levelno == logging.INFO
        assert record.getMessage() == record.transition
        assert (record.task_id, record.attempt_id) == (task.pk, op.attempt_id), record.__dict__
    ran = [r for r in lines if r.transition != "operation.proposed"]
    assert len(ran) == 6
    # Each claim and the acceptance of its report name the lease generation they ran under,
    # and the worker's execution.
    assert [r.lease_generation for r in ran] == [1, 1, 2, 2, 3, 3]
    assert {r.execution_id for r in ran} == {driver.execution}
    assert [r.to for r in ran if r.transition != "operation.claimed"][-1] == "succeeded"


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"tests.transition_logs.{id(out)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, out


def _served(logger: logging.Logger, header: str | None) -> HttpResponse:
    """A request through the request id and work context middleware, its view writing a line
    and binding an operation; then a line after the request."""

    def view(request):
        logger.info("handling")
        return HttpResponse()

    def routed(request):
        WorkContextMiddleware(view).process_view(request, view, (), {"operation_id": "op_1"})
        return view(request)

    extra = {} if header is None else {"HTTP_X_REQUEST_ID": header}
    chain = RequestIdMiddleware(WorkContextMiddleware(routed))
    return chain(RequestFactory().get("/api/v1/operations/op_1", **extra))


def test_a_request_id_is_kept_when_safe_made_otherwise_and_returned():
    logger, out = _logger(json_formatter())
    kept = _served(logger, "agent-run-42:step/7")
    made = _served(logger, None)
    unsafe = _served(logger, "two words X-Injected: 1")
    too_long = _served(logger, "a" * 200)
    logger.info("answered")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert kept["X-Request-ID"] == "agent-run-42:step/7"
    for response in (made, unsafe, too_long):
        assert len(response["X-Request-ID"]) == 32 and response["X-Request-ID"].isalnum()
    assert len({made["X-Request-ID"], unsafe["X-Request-ID"], too_long["X-Request-ID"]}) == 3
    ids = [line.get("request_id") for line in lines]
    assert ids[:4] == [r["X-Request-ID"] for r in (kept, made, unsafe, too_long)]
    assert all(line["operation_id"] == "op_1" for line in lines[:4])
    # Once answered, the work's ids are unbound; its request id stays for the lines written
    # about it after the middleware (Django's 4xx/5xx line, the server's access line), and
    # the next request's replaces it (above: each line names its own request's).
    assert "operation_id" not in lines[4]
    assert lines[4]["request_id"] == too_long["X-Request-ID"]


def test_a_transition_line_names_its_fields_over_what_is_bound_in_either_format():
    json_logger, json_out = _logger(json_formatter())
    plain_logger, plain_out = _logger(PlainFormatter("%(levelname)s %(message)s"))
    fields = {
        "transition": "operation.claimed",
        "task_id": "tsk_1",
        "operation_id": "op_2",
        "lease_generation": 3,
        "actor": "execution:exe_1",
    }
    with bound_contextvars(operation_id="op_1", request_id="r1"):
        json_logger.info("operation.claimed", extra=fields)
        plain_logger.info("operation.claimed", extra=fields)
    record = json.loads(json_out.getvalue())
    assert record["event"] == "operation.claimed"
    assert record["operation_id"] == "op_2" and record["request_id"] == "r1"
    assert (record["lease_generation"], record["actor"]) == (3, "execution:exe_1")
    assert plain_out.getvalue().strip() == (
        "INFO operation.claimed [request_id=r1 task_id=tsk_1 operation_id=op_2 "
        "lease_generation=3 actor=execution:exe_1]"
    )


def _json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.workers
@pytest.mark.postgres
def test_the_request_id_goes_with_the_work_to_the_workers_lines(workers, tmp_path: Path):
    """A proposal with an ``X-Request-ID`` whose call fails twice (transient) before it
    succeeds: the web's lines of that request and every line the worker writes about the three
    deliveries it caused (its retries' messages carry the id on) name that request id."""
    server = server_start(tmp_path, LOG_FORMAT="json")
    (worker,) = workers.start(LOG_FORMAT="json", RETRY_BASE_SECONDS=0.05, RETRY_CAP_SECONDS=0.1)
    request_id = f"req-{uuid.uuid4().hex}"
    owner = factories.agent()
    try:
        with httpx.Client(base_url=server.url, timeout=20) as http:
            task = http.post("/api/v1/tasks", json={"name": "logs"}, headers=owner.headers)
            assert task.status_code == 201, task.text
            made = http.post(
                f"/api/v1/tasks/{task.json()['id']}/operations",
                json={"tool": "demo.echo", "params": {"_fault": "transient:2"}, "step": "flaky"},
                headers={**owner.headers, "X-Request-ID": request_id},
            )
            assert made.status_code == 201, made.text
            assert made.headers["X-Request-ID"] == request_id
            assert task.headers["X-Request-ID"] not in ("", request_id)
            op_id = made.json()["id"]
            wait_for(
                lambda: Operation.objects.get(pk=op_id).status == "succeeded",
                timeout=60,
                what=f"the worker to run the operation:\n{worker.tail()}",
            )
    finally:
        server.stop()

    def about_it() -> list[dict]:
        return [r for r in _json_lines(worker.log) if r.get("operation_id") == op_id]

    wait_for(
        lambda: any(r.get("transition") == "operation.succeeded" for r in about_it()),
        timeout=30,
        what=f"the worker's line of the acceptance:\n{worker.tail()}",
    )
    web = [r for r in _json_lines(server.log) if r.get("request_id") == request_id]
    assert [r["transition"] for r in web if r.get("transition")] == ["operation.proposed"]
    assert all(r.get("operation_id") in (None, op_id) for r in web), web
    # The server's access line of that request names it too, and no other request's does.
    access = [r for r in web if r["logger"] == "uvicorn.access"]
    assert len(access) == 1 and "POST /api/v1/tasks/" in access[0]["event"], web
    done = about_it()
    assert {r.get("request_id") for r in done} == {request_id}, done
    ran = [r["transition"] for r in done if r.get("transition")]
    assert ran.count("operation.claimed") == 3, ran
    assert ran.count("operation.succeeded") == 1, ran
    for record in done:
        assert record["task_id"] == task.json()["id"] and record["execution_id"], record
