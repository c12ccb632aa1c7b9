"""Notifications have a Celery queue of their own by default (issue 34): a dead webhook, retried
with backoff for up to a day, holds the slots of the pool that reads that queue, never the work
queue's. A notification is published there, a worker of the work queue alone leaves it, and the
default layout (`make run`'s runstack, in either mode) starts a pool for each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from console.management.commands import runstack
from runtime.actors import SYSTEM
from runtime.drainers import queue_of
from runtime.models import Execution, Invocation, Operation
from runtime.notifications.dispatch import notification_task_id
from runtime.specs import OperationSpec
from runtime.transitions.propose import operation_propose
from tests import factories
from tests.conftest import ROOT, wait_for
from tests.system.test_embedded_run import _embedded_env

NOTIFY_TOOLS = ("notify.email", "notify.webhook", "notify.slack")


def _queues(argv: list[str]) -> list[str]:
    return argv[argv.index("-Q") + 1].split(",")


def _notification(step: str = "tell") -> Operation:
    op, created = operation_propose(
        SYSTEM,
        notification_task_id(timezone.now()),
        OperationSpec(
            tool="notify.email",
            step=step,
            params={"to": ["someone@example.test"], "subject": "hello", "body": "a message"},
        ),
    )
    assert created
    return op


def test_notification_tools_are_published_to_a_queue_of_their_own_by_default():
    assert settings.NOTIFY_QUEUE != settings.CELERY_QUEUE
    for tool in NOTIFY_TOOLS:
        assert queue_of(tool) == settings.NOTIFY_QUEUE, tool
    assert queue_of("demo.echo") == settings.CELERY_QUEUE
    assert settings.CELERY_QUEUES == [settings.CELERY_QUEUE, settings.NOTIFY_QUEUE]


def test_the_default_layout_runs_a_pool_for_each_queue_notifications_apart():
    pools = runstack.worker_pools(sys.executable)
    assert set(pools) == {"worker", "notifier"}
    assert _queues(pools["worker"]) == [settings.CELERY_QUEUE]
    assert _queues(pools["notifier"]) == [settings.NOTIFY_QUEUE]
    concurrency = {name: argv[argv.index("--concurrency") + 1] for name, argv in pools.items()}
    assert concurrency == {
        "worker": str(settings.WORKERS),
        "notifier": str(settings.NOTIFY_WORKERS),
    }


@pytest.mark.django_db
@pytest.mark.parametrize("only", ["web,worker,beat", "worker,beat", "worker"])
def test_runstack_starts_the_notifier_with_the_workers(only, monkeypatch, tmp_path: Path):
    """What `make run` hands its supervisor (the embedded run of this test is `make run`'s
    mode; the services run is the deploy's): both pools whenever the workers run."""
    started: dict[str, list[str]] = {}

    class Supervisor:
        def __init__(self, commands: dict[str, list[str]], *args: Any, **kwargs: Any) -> None:
            started.update(commands)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(runstack, "Supervisor", Supervisor)
    # The web's announcement waits for the web to answer: not started here.
    monkeypatch.setattr(runstack.Command, "_announce_when_ready", lambda *a, **k: None)
    monkeypatch.setattr(settings, "DATA_DIR", tmp_path)
    with pytest.raises(SystemExit):
        call_command("runstack", "--only", only, "--logs", "terminal")
    assert {"worker", "notifier"} <= set(started)
    assert set().union(*(_queues(started[p]) for p in ("worker", "notifier"))) == set(
        settings.CELERY_QUEUES
    )
    assert _queues(started["notifier"]) == [settings.NOTIFY_QUEUE]


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.delete(*settings.CELERY_QUEUES)
    yield client
    client.delete(*settings.CELERY_QUEUES)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_notification_is_published_to_its_queue_not_the_work_queue(broker):
    _notification()
    assert broker.llen(settings.NOTIFY_QUEUE) == 1
    assert broker.llen(settings.CELERY_QUEUE) == 0


def _parent_reads(pid: int) -> list[str]:
    """The queues read by the Celery worker whose prefork child is ``pid``."""
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    argv = Path(f"/proc/{parent}/cmdline").read_bytes().decode().split("\0")
    return _queues(argv)


@pytest.mark.workers
@pytest.mark.postgres
def test_a_work_queue_worker_leaves_notifications_and_the_default_layout_runs_them(workers):
    env = {"EMAIL_BACKEND": "django.core.mail.backends.dummy.EmailBackend"}
    workers.start(queues=",".join(settings.WORK_QUEUES), **env)
    owner = factories.agent()
    echo = factories.operation(owner, factories.task(owner), params={"n": 1})
    message = _notification()
    wait_for(
        lambda: Operation.objects.get(pk=echo.pk).status == "succeeded",
        timeout=60,
        what="the work queue's operation",
    )
    # The work pool ran what came after the notification, and left the notification waiting.
    assert Operation.objects.get(pk=message.pk).status == "pending"
    broker = redis.Redis.from_url(os.environ["REDIS_URL"])
    assert broker.llen(settings.NOTIFY_QUEUE) == 1

    workers.start_supervised(only="worker", **env)  # as `make run` starts the workers
    wait_for(
        lambda: Operation.objects.get(pk=message.pk).status == "succeeded",
        timeout=60,
        what="the notifier to send the notification",
    )
    (call,) = Invocation.objects.filter(operation=message)
    sender = Execution.objects.get(pk=call.execution_id)
    assert _parent_reads(sender.pid) == [settings.NOTIFY_QUEUE]


_PROPOSE = """
from django.utils import timezone
from runtime.actors import SYSTEM
from runtime.notifications.dispatch import notification_task_id
from runtime.specs import OperationSpec
from runtime.transitions.propose import operation_propose
op, _ = operation_propose(SYSTEM, notification_task_id(timezone.now()), OperationSpec(
    tool="notify.email", step="tell",
    params={"to": ["someone@example.test"], "subject": "hello", "body": "a message"}))
print(op.pk)
"""
_STATUS = "from runtime.models import Operation; print(Operation.objects.get(pk={!r}).status)"


@pytest.mark.system
def test_make_runs_embedded_workers_send_a_notification(tmp_path: Path):
    """The embedded mode end to end (SQLite, the SQLAlchemy broker): of the workers `make run`
    starts, the notifier takes a notification from its own queue."""
    env = _embedded_env(tmp_path / "data")

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    manage("migrate", "--noinput")
    log = tmp_path / "runstack.log"
    with log.open("wb") as out:
        stack = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--only", "worker"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        op_id = manage("shell", "-c", _PROPOSE)
        wait_for(
            lambda: manage("shell", "-c", _STATUS.format(op_id)) == "succeeded",
            timeout=120,
            interval=1,
            what=f"the notification to be sent:\n{log.read_text(errors='replace')[-4000:]}",
        )
        # The notifier ran it (each process logs to its own file in this mode), not the work pool.
        logs = tmp_path / "data" / "logs"
        assert "runtime.execute_operation[" in (logs / "notifier.log").read_text()
        assert "runtime.execute_operation[" not in (logs / "worker.log").read_text()
    finally:
        os.killpg(stack.pid, signal.SIGINT)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait(timeout=10)
