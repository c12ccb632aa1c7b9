"""Who may call and what each caller sees: 401 without a working token, agents confined to their
own tasks (404, never a hint that another agent's task exists), console tokens seeing all tasks,
and a user without a role seeing only what it created."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from runtime.models import Event, Operation, Task
from runtime.tokens import token_issue_for_user, token_revoke
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.postgres


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/tasks"),
        ("post", "/api/v1/tasks"),
        ("get", "/api/v1/operations"),
        ("get", "/api/v1/tasks/tsk_x"),
        ("get", "/api/v1/tasks/tsk_x/events"),
    ],
)
def test_no_token_is_401_in_the_error_format(db, method, path):
    response = getattr(APIClient(), method)(path, format="json")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    [
        "Bearer not-a-token",
        "Bearer ac_000000000000_forged",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Bearer ac_\u00ff\u00ff_x",
    ],
)
def test_a_bad_token_is_401_and_creates_nothing(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_error(post_json(client, "/api/v1/tasks", {"name": "x"}), 401, "not_authenticated")
    assert_error(client.get("/api/v1/tasks"), 401, "not_authenticated")
    assert not Task.objects.exists()


def test_a_token_with_a_right_prefix_and_wrong_secret_is_401(db):
    alice = factories.agent()
    prefix = alice.token.rsplit("_", 1)[0]
    forged = f"{prefix}_{'A' * 43}"
    assert_error(_client(forged).get("/api/v1/tasks"), 401, "not_authenticated")


def test_a_revoked_token_is_401(db):
    alice = factories.agent()
    client = alice.client()
    assert client.get("/api/v1/tasks").status_code == 200
    token_id = alice.token.split("_")[1]
    from runtime.models import ApiToken

    assert token_revoke(ApiToken.objects.get(prefix=token_id).pk)
    assert_error(client.get("/api/v1/tasks"), 401, "not_authenticated")
    assert_error(post_json(client, "/api/v1/tasks", {"name": "x"}), 401, "not_authenticated")


def test_a_deactivated_users_token_is_401(db):
    user = factories.console_user("admin")
    client = user.client()
    assert client.get("/api/v1/tasks").status_code == 200
    get_user_model().objects.filter(pk=user.actor.user_id).update(is_active=False)
    assert_error(client.get("/api/v1/tasks"), 401, "not_authenticated")


def test_another_agents_task_operation_and_events_are_404(db):
    alice, bob = factories.agent(), factories.agent()
    task = factories.task(alice, "alice's secret")
    op = factories.operation(alice, task, executor="agent")
    client = bob.client()

    assert_error(client.get(f"/api/v1/tasks/{task.pk}"), 404, "not_found")
    assert_error(client.get(f"/api/v1/tasks/{task.pk}/operations"), 404, "not_found")
    assert_error(client.get(f"/api/v1/tasks/{task.pk}/events"), 404, "not_found")
    assert_error(
        client.get(f"/api/v1/tasks/{task.pk}/events", HTTP_ACCEPT="text/event-stream"),
        404,
        "not_found",
    )
    assert_error(client.get(f"/api/v1/operations/{op.pk}"), 404, "not_found")
    assert client.get("/api/v1/tasks").json()["results"] == []
    assert client.get("/api/v1/operations").json()["results"] == []
    assert client.get("/api/v1/operations", {"task": task.pk}).json()["results"] == []
    # The 404 is the same as for a task that does not exist: nothing to tell them apart.
    unknown = client.get("/api/v1/tasks/tsk_01m8v8c7rtb8v0sfnbapjg1e9j")
    assert unknown.json() == client.get(f"/api/v1/tasks/{task.pk}").json()


def test_another_agent_cannot_act_on_a_task_or_its_operations(db):
    alice, bob = factories.agent(), factories.agent()
    task = factories.task(alice)
    op = factories.operation(alice, task, executor="agent")
    client = bob.client()
    events_before = Event.objects.filter(task=task).count()

    response = post_json(
        client, f"/api/v1/tasks/{task.pk}/operations", {"tool": "demo.echo", "step": "s"}
    )
    assert_error(response, 404, "not_found")
    assert_error(client.post(f"/api/v1/operations/{op.pk}/claim"), 404, "not_found")
    assert_error(
        post_json(
            client,
            f"/api/v1/operations/{op.pk}/heartbeat",
            {"lease_generation": 1, "lease_token": "t"},
        ),
        404,
        "not_found",
    )
    assert_error(
        post_json(
            client,
            f"/api/v1/operations/{op.pk}/complete",
            {"lease_generation": 1, "lease_token": "t", "outcome": "succeeded"},
        ),
        404,
        "not_found",
    )
    assert Operation.objects.filter(task=task).count() == 1
    assert Operation.objects.get(pk=op.pk).status == "pending"
    assert Event.objects.filter(task=task).count() == events_before


def test_a_console_user_token_sees_every_task(db):
    alice, bob = factories.agent(), factories.agent()
    tasks = {factories.task(alice).pk, factories.task(bob).pk}
    op = factories.operation(bob, factories.task(bob))
    tasks.add(op.task_id)
    support = factories.console_user("support")

    client = support.client()
    listed = {t["id"] for t in client.get("/api/v1/tasks").json()["results"]}
    assert listed == tasks
    for task_id in tasks:
        assert client.get(f"/api/v1/tasks/{task_id}").status_code == 200
        assert client.get(f"/api/v1/tasks/{task_id}/events").status_code == 200
    assert client.get(f"/api/v1/operations/{op.pk}").status_code == 200


def test_a_user_without_a_role_sees_only_what_it_created(db):
    plain = get_user_model().objects.create_user("plain", password="long-enough-pw")
    client = _client(token_issue_for_user("plain").secret)
    alice = factories.agent()
    theirs = factories.task(alice)

    created = post_json(client, "/api/v1/tasks", {"name": "mine"})
    assert created.status_code == 201
    mine = created.json()["id"]
    assert Task.objects.get(pk=mine).created_by_id == plain.pk

    assert [t["id"] for t in client.get("/api/v1/tasks").json()["results"]] == [mine]
    assert client.get(f"/api/v1/tasks/{mine}").status_code == 200
    assert_error(client.get(f"/api/v1/tasks/{theirs.pk}"), 404, "not_found")
    assert_error(client.get(f"/api/v1/tasks/{theirs.pk}/events"), 404, "not_found")
    # And the agent does not see the user's task either.
    assert_error(alice.client().get(f"/api/v1/tasks/{mine}"), 404, "not_found")


def test_a_session_login_works_for_reads(db):
    # People in the browser use the session; the API accepts it as the same user.
    operator = factories.console_user("operator")
    task = factories.task(factories.agent())
    client = APIClient()
    assert client.login(username=operator.actor.name, password=factories.PASSWORD)
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 200
