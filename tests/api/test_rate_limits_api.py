"""Login and token authentication answer 429 with Retry-After once an account or a client
address used up its failed attempts; a good login or token gives its attempt back."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from runtime.models import Task
from tests import factories
from tests.api.support import assert_error, post_json

# Both databases: embedded (SQLite, rate limits counted in the database) and services.
pytestmark = [pytest.mark.django_db]


@override_settings(RATE_TOKEN_PER_ACCOUNT=3, RATE_TOKEN_PER_ADDRESS=100)
def test_guessing_a_tokens_secret_is_429_with_retry_after_and_nothing_changes():
    agent = factories.agent()
    prefix = agent.token.rsplit("_", 1)[0]
    guesser = APIClient()
    guesser.credentials(HTTP_AUTHORIZATION=f"Bearer {prefix}_{'A' * 43}")
    for _ in range(3):
        assert_error(guesser.get("/api/v1/tasks"), 401, "not_authenticated")
    refused = post_json(guesser, "/api/v1/tasks", {"name": "x"})
    assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused["Retry-After"]) <= 300
    assert not Task.objects.exists()
    # While the account is limited even its genuine token is refused (a right guess must not
    # be told apart from a wrong one); other tokens, used successfully, are never limited.
    assert_error(agent.client().get("/api/v1/tasks"), 429, "rate_limited")
    other = factories.agent()
    for _ in range(10):
        assert other.client().get("/api/v1/tasks").status_code == 200


@override_settings(RATE_TOKEN_PER_ACCOUNT=100, RATE_TOKEN_PER_ADDRESS=4)
def test_failed_tokens_from_one_address_are_limited_across_tokens():
    for n in range(4):
        client = APIClient(REMOTE_ADDR="10.0.0.9")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer ac_{n:012d}_{'B' * 43}")
        assert_error(client.get("/api/v1/tasks"), 401, "not_authenticated")
    client = APIClient(REMOTE_ADDR="10.0.0.9")
    client.credentials(HTTP_AUTHORIZATION="Bearer ac_999999999999_x")
    assert_error(client.get("/api/v1/tasks"), 429, "rate_limited")
    # Another address is not affected.
    other = APIClient(REMOTE_ADDR="10.0.0.10")
    other.credentials(HTTP_AUTHORIZATION="Bearer ac_999999999999_x")
    assert_error(other.get("/api/v1/tasks"), 401, "not_authenticated")


@override_settings(RATE_LOGIN_PER_ACCOUNT=3, RATE_LOGIN_PER_ADDRESS=100)
def test_login_is_limited_per_account_and_a_good_password_is_refused_too_once_limited():
    person = factories.console_user("operator")
    browser = Client()
    for _ in range(3):
        response = browser.post("/login/", {"username": person.actor.name, "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    refused = browser.post(
        "/login/", {"username": person.actor.name, "password": factories.PASSWORD}
    )
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert b"Too many attempts" in refused.content
    assert browser.get("/").status_code == 302  # not logged in


@override_settings(RATE_LOGIN_PER_ACCOUNT=2, RATE_LOGIN_PER_ADDRESS=100)
def test_successful_logins_do_not_use_up_the_budget():
    person = factories.console_user("operator")
    for _ in range(5):
        browser = Client()
        response = browser.post(
            "/login/", {"username": person.actor.name, "password": factories.PASSWORD}
        )
        assert response.status_code == 302
        assert browser.get("/").status_code == 200
