"""Logs: with ``LOG_FORMAT=json`` every line is a JSON object, and a line about a piece of work
carries its task, attempt, operation and execution ids (a real worker process running an
operation; the web binding an operation route's ids); the default stays a readable line."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from console.logformat import PlainFormatter, WorkContextMiddleware, json_formatter
from runtime.logcontext import WORK_IDS, work_bound
from runtime.models import Operation
from tests import factories
from tests.conftest import wait_for


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"tests.json_logs.{id(out)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, out


def test_a_json_line_carries_the_bound_ids_and_nothing_stays_bound():
    logger, out = _logger(json_formatter())
    with work_bound(operation_id="op_1", execution_id="exe_1"):
        logger.info("claimed %s", "it")
    logger.warning("after")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "claimed it"
    assert first["level"] == "info"
    assert (first["operation_id"], first["execution_id"]) == ("op_1", "exe_1")
    assert "timestamp" in first and first["logger"].startswith("tests.json_logs")
    assert not set(WORK_IDS) & set(second)


def test_the_readable_line_names_the_work_at_its_end():
    logger, out = _logger(PlainFormatter("%(levelname)s %(message)s"))
    with work_bound(task_id="tsk_1", operation_id="op_1"):
        logger.info("ran")
    logger.info("idle")
    assert out.getvalue().splitlines() == [
        "INFO ran [task_id=tsk_1 operation_id=op_1]",
        "INFO idle",
    ]


def test_the_web_binds_an_operation_routes_ids_for_that_request_only():
    logger, out = _logger(json_formatter())

    def view(request):
        logger.info("handling")
        return HttpResponse()

    middleware = WorkContextMiddleware(view)
    request = RequestFactory().post("/api/v1/operations/op_9/complete")

    def get_response(req):
        middleware.process_view(req, view, (), {"operation_id": "op_9", "other": "x"})
        return view(req)

    WorkContextMiddleware(get_response)(request)
    logger.info("between requests")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["operation_id"] == "op_9" and "other" not in lines[0]
    assert "operation_id" not in lines[1]


@pytest.mark.workers
@pytest.mark.postgres
def test_a_worker_with_json_logs_writes_the_ids_on_each_line_about_the_operation(workers):
    (worker,) = workers.start(LOG_FORMAT="json", RUNTIME_LOG_LEVEL="DEBUG")
    owner = factories.agent()
    task = factories.task(owner)
    op = factories.operation(owner, task, tool="demo.echo", params={"n": 1})
    wait_for(
        lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
        timeout=60,
        what=f"the worker to run the operation:\n{worker.tail()}",
    )

    def about_it() -> list[dict]:
        found = []
        for line in worker.log.read_text().splitlines():
            if not line.startswith("{"):
                continue  # Celery's banner is printed, not logged
            record = json.loads(line)
            if op.pk in json.dumps(record):
                found.append(record)
        return found

    wait_for(lambda: any(r.get("event", "").endswith("reported succeeded") for r in about_it()),
             timeout=30, what=f"the worker's report line:\n{worker.tail()}")  # fmt: skip
    lines = about_it()
    for record in lines:
        assert record["task_id"] == task.pk, record
        assert record["attempt_id"] == op.attempt_id, record
        assert record["operation_id"] == op.pk, record
        assert record["execution_id"].startswith("exe"), record
