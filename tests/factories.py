"""Factories for tests: agents with tokens, console users with roles, tasks, operations."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from rest_framework.test import APIClient

from runtime.accounts import console_user_create
from runtime.actors import Actor, actor_for_agent, actor_for_user
from runtime.executor import operation_execute
from runtime.models import Execution, Operation, Task
from runtime.rules.statuses import OperationStatus
from runtime.specs import OperationSpec
from runtime.tasks import TaskSpec, task_create
from runtime.tokens import token_issue_for_agent, token_issue_for_user
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from runtime.transitions.propose import operation_propose

_n = itertools.count(1)
PASSWORD = "correct-horse-battery"


@dataclass
class Principal:
    actor: Actor
    token: str

    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client

    def actor_user(self) -> Any:
        """The Django user behind a console principal (for session logins)."""
        from django.contrib.auth import get_user_model

        return get_user_model().objects.get(pk=self.actor.user_id)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def agent(name: str | None = None) -> Principal:
    issued = token_issue_for_agent(name or f"agent-{next(_n)}")
    assert issued.token.agent is not None
    return Principal(actor_for_agent(issued.token.agent.pk, issued.token.agent.name), issued.secret)


def console_user(role: str, username: str | None = None) -> Principal:
    username = username or f"{role}-{next(_n)}"
    user = console_user_create(username, role, PASSWORD)
    issued = token_issue_for_user(username)
    return Principal(actor_for_user(user.pk, username), issued.secret)


def task(owner: Principal | Actor, name: str = "a task", **spec: Any) -> Task:
    actor = owner.actor if isinstance(owner, Principal) else owner
    return task_create(actor, TaskSpec(name=name, **spec))


def operation(
    owner: Principal | Actor, task_obj: Task, *, step: str | None = None, **spec: Any
) -> Operation:
    actor = owner.actor if isinstance(owner, Principal) else owner
    spec.setdefault("tool", "demo.echo")
    op, _ = operation_propose(
        actor, task_obj.pk, OperationSpec(step=step or f"step-{next(_n)}", **spec)
    )
    return op


def unresolved_operation(
    owner: Principal | None = None, task_obj: Task | None = None, step: str | None = None
) -> Operation:
    """A ``demo.notify`` claimed and its call's outcome lost: notify has no contract to recover
    with, so it waits for a person in the unresolved queue. Returns it as it now is."""
    owner = owner or agent()
    task_obj = task_obj or task(owner, "tell the customer")
    op = operation(owner, task_obj, step=step, tool="demo.notify", params={"to": "c@x"})
    execution = Execution.objects.create(host="test", pid=1).pk
    lease = operation_claim(op.pk, execution_id=execution)
    assert isinstance(lease, Lease)
    operation_report(
        op.pk,
        lease_generation=lease.lease_generation,
        lease_token=lease.lease_token,
        state_version=lease.state_version,
        report=Report(outcome="unknown", message="lost response"),
        execution_id=execution,
    )
    return Operation.objects.get(pk=op.pk)


def run_claimable(task_id: str) -> None:
    """Run every claimable operation of the task in this process, as a worker would, until
    none is left (the saga's compensations included)."""
    for _ in range(20):
        ready = list(
            Operation.objects.filter(
                task_id=task_id, status__in=OperationStatus.CLAIMABLE
            ).values_list("pk", flat=True)
        )
        if not ready:
            return
        for op_id in ready:
            operation_execute(op_id)
    raise AssertionError("work kept appearing")
