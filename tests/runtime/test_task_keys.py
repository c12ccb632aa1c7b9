"""Get-or-create by ``external_id`` under real concurrency (PostgreSQL): separate processes
creating under one key at once make one task, and two requests that both found no task before
either inserted (held together at the crash point between the read and the insert) still make
one: the unique constraint decides, the loser finds the winner's task once it committed."""

from __future__ import annotations

import multiprocessing

import pytest

from runtime.models import Event, Task
from tests import factories
from tests.concurrency import barrier_at, in_thread
from tests.conftest import test_database_url as database_url
from tests.processes import task_get_or_create_once

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROCESSES = 4


def test_processes_creating_under_one_key_at_once_make_one_task():
    alice = factories.agent()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES, timeout=120)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=task_get_or_create_once,
            args=(database_url(), alice.actor.agent_id, alice.actor.name, "nightly", barrier, out),
        )
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    results = [out.get(timeout=10) for _ in procs]
    assert len({task_id for task_id, _ in results}) == 1
    assert sorted(created for _, created in results) == [False] * (PROCESSES - 1) + [True]
    task = Task.objects.get(agent_id=alice.actor.agent_id)
    assert task.external_id == "nightly"
    assert Event.objects.filter(task=task, type="task.created").count() == 1


def test_two_requests_that_both_found_no_task_make_one_201_and_one_200():
    alice = factories.agent()

    def create() -> tuple[int, str]:
        response = alice.client().post(
            "/api/v1/tasks", {"name": "keyed", "external_id": "race"}, format="json"
        )
        return response.status_code, response.json()["id"]

    with barrier_at("task_key.after_lookup", 2):
        racers = [in_thread(create, f"creator-{n}") for n in range(2)]
        for thread, _ in racers:
            thread.join(60)
    results = sorted(f.result(timeout=1) for _, f in racers)
    assert [status for status, _ in results] == [200, 201]
    assert results[0][1] == results[1][1]
    assert Task.objects.filter(agent_id=alice.actor.agent_id).count() == 1


def test_a_concurrent_creation_with_other_input_is_refused():
    alice = factories.agent()

    def create(name: str) -> int:
        response = alice.client().post(
            "/api/v1/tasks", {"name": name, "external_id": "race"}, format="json"
        )
        return response.status_code

    with barrier_at("task_key.after_lookup", 2):
        racers = [in_thread(lambda n=n: create(f"name-{n}"), f"creator-{n}") for n in range(2)]
        for thread, _ in racers:
            thread.join(60)
    assert sorted(f.result(timeout=1) for _, f in racers) == [201, 422]
    assert Task.objects.filter(agent_id=alice.actor.agent_id).count() == 1
