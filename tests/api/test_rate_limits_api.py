"""Login and token authentication check the credential first and count only failures: a good
token is never refused, whoever failed before it; failures answer 429 with Retry-After once
their address (or token prefix) is over its limit; a username flooded with wrong passwords
makes its owner wait a growing delay, at most RATE_LOGIN_DELAY_MAX_SECONDS, never a lock.
Time is moved with a fake clock (runtime.ratelimits.clock), not slept through."""

from __future__ import annotations

import time

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from runtime import ratelimits
from runtime.models import Task
from tests import factories
from tests.api.support import assert_error, post_json

# Both databases: embedded (SQLite, rate limits counted in the database) and services.
pytestmark = [pytest.mark.django_db]


class FakeClock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(ratelimits, "clock", fake, raising=False)
    return fake


def _bearer(token: str, address: str = "127.0.0.1") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _login(address: str, username: str, password: str) -> tuple[Client, object]:
    browser = Client(REMOTE_ADDR=address)
    return browser, browser.post("/login/", {"username": username, "password": password})


@override_settings(RATE_TOKEN_PER_ACCOUNT=3, RATE_TOKEN_PER_ADDRESS=100)
def test_guessing_a_tokens_secret_is_429_but_the_genuine_token_still_works():
    agent = factories.agent()
    prefix = agent.token.rsplit("_", 1)[0]
    guesser = _bearer(f"{prefix}_{'A' * 43}", "10.0.0.7")
    for _ in range(3):
        assert_error(guesser.get("/api/v1/tasks"), 401, "not_authenticated")
    refused = post_json(guesser, "/api/v1/tasks", {"name": "x"})
    assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused["Retry-After"]) <= 300
    assert not Task.objects.exists()
    # A 256-bit secret cannot be guessed: the genuine token is checked first and never
    # refused for the guesses made at its prefix, from this address or any other.
    assert agent.client().get("/api/v1/tasks").status_code == 200
    assert _bearer(agent.token, "10.0.0.7").get("/api/v1/tasks").status_code == 200


@override_settings(RATE_TOKEN_PER_ACCOUNT=100, RATE_TOKEN_PER_ADDRESS=4)
def test_failed_tokens_from_one_address_are_limited_but_not_its_good_tokens():
    for n in range(4):
        client = _bearer(f"ac_{n:012d}_{'B' * 43}", "10.0.0.9")
        assert_error(client.get("/api/v1/tasks"), 401, "not_authenticated")
    assert_error(_bearer("ac_999999999999_x", "10.0.0.9").get("/api/v1/tasks"), 429)
    assert_error(_bearer("garbage", "10.0.0.9").get("/api/v1/tasks"), 429, "rate_limited")
    # Another address is not affected, and a good token from the limited one is served.
    assert_error(_bearer("ac_999999999999_x", "10.0.0.10").get("/api/v1/tasks"), 401)
    agent = factories.agent()
    for _ in range(5):
        assert _bearer(agent.token, "10.0.0.9").get("/api/v1/tasks").status_code == 200


def test_malformed_tokens_are_counted_per_address_not_in_one_shared_bucket():
    for n in range(10):
        assert_error(_bearer(f"garbage-{n}", "10.0.1.1").get("/api/v1/tasks"), 401)
    response = _bearer("garbage", "10.0.1.2").get("/api/v1/tasks")
    assert_error(response, 401, "not_authenticated")


@override_settings(
    RATE_LOGIN_PER_ACCOUNT=3,
    RATE_LOGIN_PER_ADDRESS=7,
    RATE_LOGIN_DELAY_BASE_SECONDS=1,
    RATE_LOGIN_DELAY_MAX_SECONDS=8,
)
def test_a_flood_of_wrong_passwords_delays_the_owner_at_most_the_cap(clock):
    person = factories.console_user("operator")
    name = person.actor.name
    # Three free failures, then each counted one doubles the wait (1, 2, 4, 8, 8 ... s).
    for _ in range(3):
        _, response = _login("10.0.2.1", name, "wrong")
        assert response.status_code == 200  # the form again, with its error
    _, response = _login("10.0.2.1", name, "wrong")
    assert response.status_code == 200  # counted: the account now waits 1 s
    _, refused = _login("10.0.2.1", name, "wrong")
    assert refused.status_code == 429
    assert b"Too many attempts" in refused.content
    assert int(refused["Retry-After"]) == 1
    # The right password, from anywhere, is refused the same way while the account waits: a
    # right guess must look like a wrong one.
    browser, refused = _login("10.0.2.9", name, factories.PASSWORD)
    assert refused.status_code == 429
    assert browser.get("/").status_code == 302  # not logged in
    clock.now += 1
    _, response = _login("10.0.2.1", name, "wrong")
    assert response.status_code == 200  # counted: 2 s
    clock.now += 2
    _, response = _login("10.0.2.1", name, "wrong")
    assert response.status_code == 200  # counted: 4 s
    clock.now += 4
    _, response = _login("10.0.2.1", name, "wrong")
    assert response.status_code == 200  # counted: 8 s; the address has used its 7 failures
    # The flood goes on from that address, now locked (the right password included), and what
    # it sends no longer counts against the account.
    for password in ["wrong", "wrong", factories.PASSWORD]:
        clock.now += 3
        _, refused = _login("10.0.2.1", name, password)
        assert refused.status_code == 429
        assert int(refused["Retry-After"]) > 8
    # At most the cap (8 s) after the last counted failure, the owner gets in from elsewhere.
    browser, response = _login("10.0.2.9", name, factories.PASSWORD)
    assert response.status_code == 302
    assert browser.get("/").status_code == 200
    # The owner's success forgets the account's failures: free ones again.
    _, response = _login("10.0.2.9", name, "wrong")
    assert response.status_code == 200


@override_settings(
    RATE_LOGIN_PER_ACCOUNT=1,
    RATE_LOGIN_PER_ADDRESS=100,
    RATE_LOGIN_DELAY_BASE_SECONDS=2,
    RATE_LOGIN_DELAY_MAX_SECONDS=5,
)
def test_wrong_passwords_from_many_addresses_make_the_owner_wait_at_most_the_cap(clock):
    person = factories.console_user("operator")
    name = person.actor.name
    # Every counted failure comes from another address, as soon as the wait allows.
    waits = []
    for n in range(5):
        _, response = _login(f"10.0.4.{n}", name, "wrong")
        assert response.status_code == 200
        if n:  # the first failure is free; each one after it makes the owner wait
            _, refused = _login("10.0.4.200", name, factories.PASSWORD)
            assert refused.status_code == 429
            waits.append(int(refused["Retry-After"]))
            clock.now += waits[-1]
    assert waits == [2, 4, 5, 5]
    _, response = _login("10.0.4.200", name, factories.PASSWORD)
    assert response.status_code == 302


@override_settings(RATE_LOGIN_PER_ACCOUNT=2, RATE_LOGIN_PER_ADDRESS=100)
def test_successful_logins_do_not_use_up_the_budget():
    person = factories.console_user("operator")
    for _ in range(5):
        browser, response = _login("10.0.3.1", person.actor.name, factories.PASSWORD)
        assert response.status_code == 302
        assert browser.get("/").status_code == 200
