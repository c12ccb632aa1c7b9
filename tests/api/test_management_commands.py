"""Account commands: tokens printed once as the last line and stored only as a digest; console
users with a role; a user's script token acting with that user's role."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from runtime.actors import user_roles
from runtime.models import Agent, ApiToken, AuditRecord, Task
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.postgres


def _run(*args: str) -> list[str]:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip().splitlines()


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _database_contains(text: str) -> bool:
    """Whether ``text`` appears anywhere in the token and agent tables."""
    with connection.cursor() as cur:
        for table in (ApiToken._meta.db_table, Agent._meta.db_table):
            cur.execute(f"SELECT count(*) FROM {table} WHERE {table}::text LIKE %s", [f"%{text}%"])
            if cur.fetchone()[0]:
                return True
    return False


def test_create_agent_token_prints_the_token_last_and_stores_only_its_digest(db):
    lines = _run("create_agent_token", "mailbot")
    token = lines[-1]
    assert " " not in token and len(token) >= 40

    stored = ApiToken.objects.get(agent__name="mailbot")
    assert stored.digest == hashlib.sha256(token.encode()).hexdigest()
    assert not _database_contains(token)
    # tok_<prefix>_<secret>: the secret may hold "_" itself (URL-safe base64), so it is all
    # after the second one (the last piece alone can be one letter, found anywhere).
    secret_part = token.split("_", 2)[2]
    assert not _database_contains(secret_part)

    client = _client(token)
    created = post_json(client, "/api/v1/tasks", {"name": "from the bot"})
    assert created.status_code == 201
    assert Task.objects.get(pk=created.json()["id"]).agent.name == "mailbot"


def test_each_run_issues_a_new_token_for_the_same_agent(db):
    first = _run("create_agent_token", "twice")[-1]
    second = _run("create_agent_token", "twice")[-1]
    assert first != second
    assert Agent.objects.filter(name="twice").count() == 1
    a = post_json(_client(first), "/api/v1/tasks", {"name": "a"}).json()["id"]
    # Both tokens act as the one agent: each sees the other's tasks.
    assert _client(second).get(f"/api/v1/tasks/{a}").status_code == 200


def test_create_console_user_with_a_role(db):
    _run("create_console_user", "olga", "--role", "operator", "--password", "s3cret-pass")
    user = get_user_model().objects.get(username="olga")
    assert user.check_password("s3cret-pass")
    assert user_roles(user.pk) == frozenset({"operator"})

    # Run again: the same user, its role and password replaced.
    _run("create_console_user", "olga", "--role", "support", "--password", "another-pass")
    user.refresh_from_db()
    assert user.check_password("another-pass")
    assert user_roles(user.pk) == frozenset({"support"})
    assert get_user_model().objects.filter(username="olga").count() == 1

    # Both are access changes, audited with who made them, never with the password.
    records = list(AuditRecord.objects.filter(subject=f"user:{user.pk}").order_by("id"))
    assert [(r.actor, r.action) for r in records] == [
        ("system:cli", "account.created"),
        ("system:cli", "account.reset"),
    ]
    assert records[1].detail == {
        "username": "olga",
        "role": "support",
        "role_before": ["operator"],
        "password_changed": True,
    }
    assert not any("s3cret" in repr(r.detail) or "another-pass" in repr(r.detail) for r in records)


def test_create_console_user_refuses_a_bad_role_or_password(db):
    with pytest.raises(CommandError):
        _run("create_console_user", "x", "--role", "overlord", "--password", "long-password")
    with pytest.raises(CommandError):
        _run("create_console_user", "x", "--role", "admin", "--password", "short")
    assert not get_user_model().objects.filter(username="x").exists()


def test_a_user_token_acts_as_that_user_with_its_role(db):
    _run("create_console_user", "sam", "--role", "support", "--password", "s3cret-pass")
    lines = _run("create_agent_token", "sam-script", "--user", "sam")
    token = lines[-1]
    stored = ApiToken.objects.get(user__username="sam")
    assert stored.agent_id is None
    assert not _database_contains(token)

    # A console role sees every task, including an agent's.
    alice = factories.agent()
    task = factories.task(alice)
    client = _client(token)
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 200
    created = post_json(client, "/api/v1/tasks", {"name": "scripted"}).json()
    assert Task.objects.get(pk=created["id"]).created_by.username == "sam"


def test_a_token_for_an_unknown_user_is_refused(db):
    with pytest.raises(CommandError):
        _run("create_agent_token", "ghost-script", "--user", "ghost")
    assert not ApiToken.objects.exists()


def test_a_user_token_follows_the_users_current_role(db):
    _run("create_console_user", "ria", "--role", "operator", "--password", "s3cret-pass")
    token = _run("create_agent_token", "ria-script", "--user", "ria")[-1]
    task = factories.task(factories.agent())
    client = _client(token)
    assert client.get(f"/api/v1/tasks/{task.pk}").status_code == 200

    # Without any role the token sees only what the user created.
    get_user_model().objects.get(username="ria").groups.clear()
    assert_error(client.get(f"/api/v1/tasks/{task.pk}"), 404, "not_found")
