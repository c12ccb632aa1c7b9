"""A service's transaction is named by its entry, never found by probing: ``operation_propose``
opens its own and refuses to run inside a caller's (as ``atomic(durable=True)`` refuses), and
``operation_propose_txn`` runs in the caller's, committing or rolling back with it; on the
one-statement form a refusal there ends the caller's transaction (no savepoint of its own)."""

from __future__ import annotations

import pytest
from django.db import transaction

from runtime.errors import TaskRefused
from runtime.models import Operation, Task
from runtime.specs import OperationSpec
from runtime.transitions.propose import operation_propose, operation_propose_txn
from tests import factories

SPEC = OperationSpec(tool="demo.echo", step="s", params={"v": 1})

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("one_statement", [True, False])
def test_the_opening_entry_refuses_to_run_inside_a_callers_transaction(settings, one_statement):
    settings.HOTPATH = one_statement
    owner = factories.agent()
    task = factories.task(owner)
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        operation_propose(owner.actor, task.pk, SPEC)
    assert not Operation.objects.filter(task=task).exists()


@pytest.mark.parametrize("one_statement", [True, False])
def test_the_txn_entry_commits_and_rolls_back_with_its_caller(settings, one_statement):
    settings.HOTPATH = one_statement
    owner = factories.agent()
    task = factories.task(owner)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        op, created = operation_propose_txn(owner.actor, task.pk, SPEC)
        assert created and Operation.objects.filter(pk=op.pk).exists()
        1 / 0  # noqa: B018 (the caller fails after the proposal)
    assert not Operation.objects.filter(task=task).exists()
    with transaction.atomic():
        op, created = operation_propose_txn(owner.actor, task.pk, SPEC)
    assert created and Operation.objects.get(pk=op.pk).status == "pending"


@pytest.mark.parametrize("one_statement", [True, False])
def test_a_refusal_in_the_opening_entry_leaves_nothing_and_no_transaction_behind(
    settings, one_statement
):
    settings.HOTPATH = one_statement
    owner = factories.agent()
    task = factories.task(owner)
    Task.objects.filter(pk=task.pk).update(paused=True)
    with pytest.raises(TaskRefused):
        operation_propose(owner.actor, task.pk, SPEC)
    # The test's own transaction is still usable: the refusal ended only the proposal's.
    assert not Operation.objects.filter(task=task).exists()


@pytest.mark.postgres
def test_a_refusal_of_the_one_statement_ends_the_callers_transaction(settings):
    settings.HOTPATH = True
    owner = factories.agent()
    task = factories.task(owner)
    Task.objects.filter(pk=task.pk).update(paused=True)
    with transaction.atomic():
        with pytest.raises(TaskRefused):
            operation_propose_txn(owner.actor, task.pk, SPEC)
        # No savepoint was spent on it: the caller's transaction is over (it rolls back).
        assert transaction.get_rollback()
