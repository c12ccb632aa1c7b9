"""The rights themselves (runtime/policy.py), one table: who holds which right on an agent's
task and on a task a user created. Roles are read at the moment of the decision."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from runtime import policy
from runtime.errors import NotAuthenticated, NotAuthorized
from runtime.models import Approval, Operation
from runtime.policy_features import can_manage_tokens
from tests import factories
from tests.concurrency import gate_at, in_thread
from tests.streams import session_of

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
    assert _holders(can_manage_tokens, people) == {"admin"}
    assert _holders(policy.can_use_console, people) == {"operator", "support", "admin", "creator"}


def test_rights_on_a_task_a_user_created(people):
    task = factories.task(people["creator"])
    assert _holders(policy.can_propose, people, task) == {"creator"}
    assert _holders(policy.can_cancel, people, task) == {"creator", "admin"}


def test_approving_needs_the_role_and_never_the_requester_nor_the_editor(people):
    def approval(**kw):
        fields = {"approver_role": "operator", "requester_key": people["owner"].key}
        return Approval(**{**fields, **kw})

    plain = approval()
    assert _holders(policy.can_decide_approval, people, plain) == {"operator", "admin", "creator"}
    # The user the requesting agent acts for is a requester too.
    for_creator = approval(requested_for_key=people["creator"].key)
    assert _holders(policy.can_decide_approval, people, for_creator) == {"operator", "admin"}
    edited = approval(editor_key=people["operator"].key)
    assert _holders(policy.can_decide_approval, people, edited) == {"admin", "creator"}
    by_admins = approval(approver_role="admin")
    assert _holders(policy.can_decide_approval, people, by_admins) == {"admin"}
    # A person asking through an agent token as the requester: refused with a reason.
    requester = approval(requester_key=people["operator"].key)
    with pytest.raises(NotAuthorized, match="requester"):
        policy.can_decide_approval(people["operator"], requester)


def test_human_side_rights(people):
    agents_task = factories.task(people["owner"])
    users_task = factories.task(people["creator"])
    assert _holders(policy.can_signal, people, agents_task) == {"owner"}
    assert _holders(policy.can_signal, people, users_task) == {"creator"}
    # "creator" holds the operator role as well.
    everyone_but = {"owner", "operator", "admin", "creator"}
    assert _holders(policy.can_control_task, people, agents_task) == everyone_but
    assert _holders(policy.can_control_task, people, users_task) == {"operator", "admin", "creator"}
    assert _holders(policy.can_edit_approval, people) == {"operator", "admin", "creator"}
    assert _holders(policy.can_manage_waits, people) == {"admin"}


def test_who_works_each_peoples_queue(people):
    assert _holders(policy.can_work_on, people, "approvals") == {"operator", "admin", "creator"}
    assert _holders(policy.can_work_on, people, "unresolved") == {"support", "admin"}
    assert _holders(policy.can_work_on, people, "elsewhere") == set()
    # Roles read now: support staff who lose the role may take nothing more.
    Group.objects.get(name="support").user_set.clear()
    assert _holders(policy.can_work_on, people, "unresolved") == {"admin"}


def test_a_role_taken_away_is_gone_at_the_next_decision(people):
    admin = people["admin"]
    can_manage_tokens(admin)
    Group.objects.get(name="admin").user_set.clear()
    # The actor object still carries the old roles; the policy reads them afresh.
    assert "admin" in admin.roles
    with pytest.raises(NotAuthorized):
        can_manage_tokens(admin)


def test_the_scope_rule_in_sql_selects_what_the_queryset_selects(people):
    """The hot path reads a proposal's task with hand-written SQL (policy.task_scope_sql): for
    every kind of actor it must see exactly the tasks task_scope lets it see."""
    from dataclasses import replace

    from runtime.actors import SYSTEM, Actor
    from runtime.models import Task

    for owner in ("owner", "other", "creator"):
        factories.task(people[owner])
    roleless = replace(people["creator"], roles=frozenset())
    actors = [*people.values(), roleless, SYSTEM, Actor(kind="stranger", name="x")]
    seen = []
    for actor in actors:
        scope, params = policy.task_scope_sql(actor, "t")
        raw = Task.objects.raw(f"SELECT t.* FROM runtime_task t WHERE {scope}", params)
        expected = set(Task.objects.filter(policy.task_scope(actor)).values_list("pk", flat=True))
        assert {t.pk for t in raw} == expected, actor
        seen.append(len(expected))
    assert 0 in seen and 1 in seen and 3 in seen  # the table has teeth: none, own, all


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stream_whose_person_is_deactivated_mid_recheck_never_ends_as_a_lost_right():
    """The recheck read the account (active), then the deactivation committed before it read
    the roles: reading the account again found no roles and ended the stream 403, as if a role
    had been taken away. The roles come from the account as read; the next recheck ends it
    401. (A real concurrent transaction commits while the recheck waits at stream.user_read.)"""
    admin = factories.console_user("admin")
    task = factories.task(factories.agent())
    user_id = admin.actor.user_id
    session_key = session_of(admin.actor_user())

    def recheck() -> str:
        try:
            policy.can_keep_streaming(
                admin.actor,
                lambda now: policy.can_follow_task(now, task),
                session_key=session_key,
            )
        except NotAuthorized:
            return "403"
        except NotAuthenticated:
            return "401"
        return "kept"

    assert recheck() == "kept"
    with gate_at("stream.user_read", "racer") as gate:
        thread, result = in_thread(recheck)
        assert gate.reached.wait(timeout=30), "the recheck never read the account"
        assert get_user_model().objects.filter(pk=user_id).update(is_active=False) == 1
        gate.release()
        thread.join()
    assert result.result() == "kept"  # this round decided on the account it read
    assert recheck() == "401"  # the next one sees the account ended
