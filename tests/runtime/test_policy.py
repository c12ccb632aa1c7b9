"""The rights themselves (runtime/policy.py), one table: who holds which right on an agent's
task and on a task a user created. Roles are read at the moment of the decision."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from runtime import policy
from runtime.errors import NotAuthorized
from runtime.models import Operation
from tests import factories

# Both databases: embedded (SQLite, rate limits counted in the database) and services.
pytestmark = [pytest.mark.django_db]

WHO = ("owner", "other", "operator", "support", "admin", "creator")


@pytest.fixture
def people():
    found = {"owner": factories.agent(), "other": factories.agent()}
    for role in ("operator", "support", "admin"):
        found[role] = factories.console_user(role)
    found["creator"] = factories.console_user("operator")
    return {name: p.actor for name, p in found.items()}


def _holders(right, people, *args) -> set[str]:
    return {name for name in WHO if policy.allowed(right, people[name], *args)}


def test_rights_on_an_agents_task(people):
    task = factories.task(people["owner"])
    op = factories.operation(people["owner"], task, executor="agent")
    op = Operation.objects.select_related("task").get(pk=op.pk)
    assert _holders(policy.can_propose, people, task) == {"owner"}
    assert _holders(policy.can_claim, people, op) == {"owner"}
    assert _holders(policy.can_cancel, people, task) == {"owner", "admin"}
    assert _holders(policy.can_resolve, people) == {"support", "admin"}
    assert _holders(policy.can_manage_tokens, people) == {"admin"}
    assert _holders(policy.can_use_console, people) == {"operator", "support", "admin", "creator"}


def test_rights_on_a_task_a_user_created(people):
    task = factories.task(people["creator"])
    assert _holders(policy.can_propose, people, task) == {"creator"}
    assert _holders(policy.can_cancel, people, task) == {"creator", "admin"}


def test_approving_needs_an_operator_who_is_not_the_requester(people):
    operator = people["operator"]
    policy.can_approve(operator, requested_by=people["owner"].label)
    with pytest.raises(NotAuthorized):
        policy.can_approve(operator, requested_by=operator.label)
    with pytest.raises(NotAuthorized):
        policy.can_approve(people["support"], requested_by=people["owner"].label)


def test_a_role_taken_away_is_gone_at_the_next_decision(people):
    admin = people["admin"]
    policy.can_manage_tokens(admin)
    Group.objects.get(name="admin").user_set.clear()
    # The actor object still carries the old roles; the policy reads them afresh.
    assert "admin" in admin.roles
    with pytest.raises(NotAuthorized):
        policy.can_manage_tokens(admin)
