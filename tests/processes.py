"""Entry points for test helper processes started with multiprocessing's ``spawn``: this module
imports nothing of Django at the top, so a fresh interpreter can import it before setup."""

from __future__ import annotations

import os
from typing import Any


def django_setup(db_url: str) -> None:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()


def propose_many(
    db_url: str,
    agent_id: str,
    agent_name: str,
    task_id: str,
    label: str,
    count: int,
    estimate: dict[str, float],
    barrier: Any,
    out: Any,
) -> None:
    """Wait at the barrier with the other processes, then propose ``count`` agent-run
    operations; report (admitted, refused)."""
    django_setup(db_url)
    from runtime.actors import actor_for_agent
    from runtime.errors import BudgetExhausted
    from runtime.specs import OperationSpec
    from runtime.transitions.propose import operation_propose

    actor = actor_for_agent(agent_id, agent_name)
    admitted = refused = 0
    barrier.wait()
    for i in range(count):
        try:
            operation_propose(
                actor,
                task_id,
                OperationSpec(
                    tool="demo.echo", step=f"{label}-{i}", estimate=estimate, executor="agent"
                ),
            )
            admitted += 1
        except BudgetExhausted:
            refused += 1
    out.put((admitted, refused))


def reserve_many(
    db_url: str, task_id: str, op_ids: list[str], amount: int, barrier: Any, out: Any
) -> None:
    """Wait at the barrier, then hold ``amount`` for each operation straight in the ledger, one
    transaction each and no task row lock around it: the ledger's own statement is all that
    stands between these processes and an over-admission. Report (admitted, refused)."""
    django_setup(db_url)
    from django.db import transaction
    from django.utils import timezone

    from runtime.budgets import budget_reserve_txn
    from runtime.errors import BudgetExhausted
    from runtime.models import Operation, Task

    task = Task.objects.get(pk=task_id)
    ops = list(Operation.objects.filter(pk__in=op_ids))
    admitted = refused = 0
    barrier.wait()
    for op in ops:
        op.estimate = {"cost_cents": amount}
        try:
            with transaction.atomic():
                budget_reserve_txn(budget=task.budget, op=op, number=0, now=timezone.now())
            admitted += 1
        except BudgetExhausted:
            refused += 1
    out.put((admitted, refused))


def propose_and_die(
    db_url: str, agent_id: str, agent_name: str, task_id: str, params: dict[str, Any], at: str
) -> None:
    """Propose a charge, then end this process as a kill would: ``at="before_commit"`` with the
    proposal written but its transaction not committed; ``at="after_commit"`` right after the
    commit, before its announcement reached the broker."""
    django_setup(db_url)
    from django.db import transaction

    from runtime.actors import actor_for_agent
    from runtime.specs import OperationSpec
    from runtime.transitions.propose import operation_propose_txn

    actor = actor_for_agent(agent_id, agent_name)
    with transaction.atomic():
        if at == "after_commit":
            # Registered first, so it runs before the proposal's own announcement hook.
            transaction.on_commit(lambda: os._exit(137))
        operation_propose_txn(
            actor,
            task_id,
            OperationSpec(tool="demo.payments.charge", step="pay", params=params),
        )
        if at == "before_commit":
            os._exit(137)
    raise AssertionError("the process should have ended")


def task_get_or_create_once(
    db_url: str, agent_id: str, agent_name: str, external_id: str, barrier: Any, out: Any
) -> None:
    """Wait at the barrier with the other processes, then create a task under ``external_id``
    (get-or-create); report (task id, created)."""
    django_setup(db_url)
    from runtime.actors import actor_for_agent
    from runtime.task_keys import task_get_or_create
    from runtime.tasks import TaskSpec

    actor = actor_for_agent(agent_id, agent_name)
    barrier.wait()
    task, created = task_get_or_create(
        actor, TaskSpec(name="keyed", input={"n": 1}, external_id=external_id)
    )
    out.put((task.pk, created))


def client_get_or_create_once(
    url: str, token: str, external_id: str, barrier: Any, out: Any
) -> None:
    """As an agent process would: a client of the running server, get-or-create its task
    under ``external_id`` once the barrier lets every process go; report the task's id. No
    retries: a loser of the race must be answered right the first time, not after a 5xx."""
    from agent_console_client import Client, RetryPolicy

    with Client(base_url=url, token=token, retry=RetryPolicy(attempts=1)) as console:
        barrier.wait()
        task = console.get_or_create_task(external_id, "keyed", {"n": 1})
    out.put(task.id)
