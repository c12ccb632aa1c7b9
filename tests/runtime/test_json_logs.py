"""Logs: with ``LOG_FORMAT=json`` every line is a JSON object (every line the worker, beat, the
web server and make run's supervisor write, banners and notices included), and a line about a
piece of work carries its task, attempt, operation and execution ids (a real worker process
running an operation; the web binding an operation route's ids); the default stays a readable
line."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from console.logformat import PlainFormatter, WorkContextMiddleware, json_formatter
from runtime.logcontext import WORK_IDS, work_bound
from runtime.models import Operation
from tests import factories
from tests.conftest import Worker, http_ok, server_start, wait_for


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
            if not line.strip():
                continue
            record = json.loads(line)  # every line: the banner is a record too
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


def _json_records(text: str, what: str) -> list[dict]:
    """Every non-empty line of ``text`` as the JSON object it must be."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(
                f"a line of the {what} is not JSON: {line!r}\n{text[-3000:]}"
            ) from None
        assert isinstance(record, dict), (what, line)
        records.append(record)
    return records


def _events(path: Path, logger: str | None = None) -> list[str]:
    return [
        str(r.get("event", ""))
        for r in _json_records(path.read_text(), path.name)
        if logger is None or r.get("logger") == logger
    ]


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in found.stdout.split()]


def _child_running(parent: Worker, word: str) -> int:
    for pid in _children(parent.proc.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if word in command:
            return pid
    raise AssertionError(f"no child of {parent.name} runs {word}:\n{parent.tail()}")


@pytest.mark.workers
@pytest.mark.postgres
def test_every_line_the_worker_beat_web_and_their_supervisor_write_is_json(workers, tmp_path):
    """With LOG_FORMAT=json, the processes as `make run` starts them (worker and beat under
    runstack's supervisor, output on its terminal) and the web server write nothing but JSON
    objects: the worker's start-up banner and its shutdown notice, a pool child's death, beat's
    start, the supervisor's restart line and announcement, uvicorn's lines (one for a request it
    refuses itself), Python warnings (Celery's SecurityWarning when run as root)."""
    stack = workers.start_supervised(only="worker,beat", LOG_FORMAT="json", SWEEP_SECONDS=1)
    web = server_start(tmp_path, LOG_FORMAT="json")
    try:
        owner = factories.agent()
        op = factories.operation(owner, factories.task(owner), tool="demo.echo", params={"n": 1})
        wait_for(
            lambda: Operation.objects.get(pk=op.pk).status == "succeeded",
            timeout=60,
            what=f"the supervised worker to run the operation:\n{stack.tail()}",
        )
        # The web: a page, a 404 under /api/, and a request uvicorn refuses before the app.
        assert http_ok(f"{web.url}/healthz")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{web.url}/api/v1/no-such-thing", timeout=5)
        with socket.create_connection(("127.0.0.1", int(web.url.rsplit(":", 1)[1]))) as conn:
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 400")
        # A pool child that dies: the worker's pool says so (and starts another).
        worker_pid = _child_running(stack, "celery")
        os.kill(_children(worker_pid)[0], signal.SIGKILL)
        wait_for(
            lambda: any("exited with" in e for e in _events(stack.log, "multiprocessing")),
            timeout=30,
            what=f"the pool's line about its child:\n{stack.tail()}",
        )
        # A worker that dies: the supervisor says so, and starts it again.
        os.kill(worker_pid, signal.SIGKILL)
        wait_for(
            lambda: any("restart in" in e for e in _events(stack.log)),
            timeout=30,
            what=f"the supervisor's restart line:\n{stack.tail()}",
        )
        wait_for(
            lambda: sum("celery worker" in e and "starting" in e for e in _events(stack.log)) >= 2,
            timeout=60,
            what=f"the restarted worker's banner:\n{stack.tail()}",
        )
        wait_for(
            lambda: any(e.startswith("beat: sweeping every 1s") for e in _events(stack.log)),
            timeout=30,
            what=f"beat's start:\n{stack.tail()}",
        )
    finally:
        stack.stop()
        web.stop()
    events = _events(stack.log)
    assert any("Agent console" in e for e in _events(stack.log, "console.runstack")), events
    assert "worker: Warm shutdown (MainProcess)" in events, events
    if os.geteuid() == 0:
        assert any("SecurityWarning" in e for e in _events(stack.log, "py.warnings")), events
    access = _events(web.log, "uvicorn.access")
    assert any('"GET /healthz HTTP/1.1" 200' in e for e in access), access
    assert "Invalid HTTP request received." in _events(web.log, "uvicorn.error")


@pytest.mark.workers
@pytest.mark.postgres
def test_a_worker_stopped_by_ctrl_c_says_so_in_json(workers):
    """Ctrl-C (SIGINT, what `make run` passes to its processes) makes Celery write two notices
    of its own; with LOG_FORMAT=json they are JSON records too."""
    (worker,) = workers.start(LOG_FORMAT="json")
    worker.proc.send_signal(signal.SIGINT)
    worker.proc.wait(timeout=30)
    events = _events(worker.log, "console.worker")
    assert any(e.startswith("celery worker") for e in events), events
    assert any("Hitting Ctrl+C again" in e for e in events), events
    assert "worker: Warm shutdown (MainProcess)" in events, events
