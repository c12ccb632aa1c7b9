"""The client's get-or-create by the caller's key (issue 38, point 2) against the real server:
a restarted agent (a new client) finds its task again under the same ``external_id``, other
input under it is IdempotencyKeyReused, and ``find_task`` reads it back; sync and async. Agent
processes started together behind a barrier, each with its own client and no retries,
get-or-create one task under one key, each answered right the first time."""

from __future__ import annotations

import asyncio
import multiprocessing

import pytest
from agent_console_client import AsyncClient, Client, RetryPolicy, errors

from runtime.models import Event, Task
from tests import factories
from tests.processes import client_get_or_create_once

pytestmark = pytest.mark.postgres

FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.5)


def test_a_restarted_agent_finds_its_task_by_its_key(server):
    agent = factories.agent()
    with Client(base_url=server.url, token=agent.token, retry=FAST) as first_run:
        assert first_run.find_task("invoice-77") is None
        task = first_run.get_or_create_task("invoice-77", "pay invoice 77", {"invoice": 77})
        assert task.external_id == "invoice-77"
    with Client(base_url=server.url, token=agent.token, retry=FAST) as second_run:
        again = second_run.get_or_create_task("invoice-77", "pay invoice 77", {"invoice": 77})
        assert again.id == task.id
        same = second_run.create_task("pay invoice 77", {"invoice": 77}, external_id="invoice-77")
        assert same.id == task.id
        found = second_run.find_task("invoice-77")
        assert found is not None and found.id == task.id
        with pytest.raises(errors.IdempotencyKeyReused):
            second_run.get_or_create_task("invoice-77", "pay invoice 78", {"invoice": 78})
    assert Task.objects.filter(external_id="invoice-77").count() == 1


def test_the_async_client_gets_or_creates_by_key(server):
    agent = factories.agent()

    async def twice() -> tuple[str, str, str | None]:
        async with AsyncClient(base_url=server.url, token=agent.token, retry=FAST) as console:
            first = await console.get_or_create_task("k-1", "async keyed", budget={"tool_calls": 3})
            second = await console.get_or_create_task(
                "k-1", "async keyed", budget={"tool_calls": 3}
            )
            found = await console.find_task("k-1")
            return first.id, second.id, found.id if found else None

    first, second, found = asyncio.run(twice())
    assert first == second == found


def test_agent_processes_getting_or_creating_one_key_at_once_make_one_task(server):
    agent = factories.agent()
    ctx = multiprocessing.get_context("spawn")
    processes = 3
    barrier = ctx.Barrier(processes, timeout=120)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=client_get_or_create_once,
            args=(server.url, agent.token, "nightly-run", barrier, out),
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0  # each got its answer (a refused or failed one raises)
    ids = [out.get(timeout=10) for _ in procs]
    (task,) = Task.objects.filter(agent_id=agent.actor.agent_id)
    assert set(ids) == {task.pk} and task.external_id == "nightly-run"
    assert Event.objects.filter(task=task, type="task.created").count() == 1
