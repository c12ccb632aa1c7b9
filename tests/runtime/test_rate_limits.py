"""Brute-force limits count failures on atomic counters: of N failures made at the same moment
from N threads, exactly those the limit allows are counted and the rest refused, in Redis
(services mode) and in the database (embedded mode's guarded UPDATEs, here on PostgreSQL with
real concurrent transactions). Per account the limit is a growing, capped delay, on a clock the
tests set instead of sleeping."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest
from django.db import connection

from runtime.models import RateCounter
from runtime.ratelimit_counters import Backoff, Limit
from runtime.ratelimits import (
    RateLimited,
    backoff_check,
    backoff_clear,
    backoff_failed,
    failure_count,
    limit_check,
)

pytestmark = [pytest.mark.postgres]

THREADS = 16
LIMIT = 5
BACKENDS = ["redis", "database"]


def _race(attempt: Callable[[], None]) -> tuple[int, list[int]]:
    barrier = threading.Barrier(THREADS)
    passed: list[int] = []
    retry_after: list[int] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            try:
                attempt()
            except RateLimited as exc:
                with lock:
                    retry_after.append(exc.retry_after)
            else:
                with lock:
                    passed.append(1)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return len(passed), retry_after


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_failures_never_overshoot_the_limit(transactional_db, backend):
    limit = Limit("test", LIMIT, 120)
    subject = uuid.uuid4().hex
    passed, refused = _race(lambda: failure_count([(limit, subject)], backend=backend))
    assert passed == LIMIT
    assert len(refused) == THREADS - LIMIT
    assert all(1 <= r <= 120 for r in refused)
    with pytest.raises(RateLimited):
        limit_check([(limit, subject)], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_failures_for_one_account_get_one_past_the_free_ones(transactional_db, backend):
    # Three free failures, then the fourth starts a wait: every other concurrent failure is
    # refused uncounted, however many arrive at once.
    backoff = Backoff("test-delay", 3, 30, 60, 120)
    subject = uuid.uuid4().hex
    passed, refused = _race(lambda: backoff_failed(backoff, subject, backend=backend))
    assert passed == 4
    assert len(refused) == THREADS - 4
    assert all(1 <= r <= 60 for r in refused)  # at most the cap


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_account_delay_doubles_up_to_its_cap_and_never_locks(transactional_db, backend):
    backoff = Backoff("test-delay", 2, 1, 4, 300)
    subject = uuid.uuid4().hex
    t = float(int(time.time()))
    backoff_failed(backoff, subject, backend=backend, now=t)
    backoff_failed(backoff, subject, backend=backend, now=t)
    backoff_check(backoff, subject, backend=backend, now=t)  # two free failures: no wait
    waits = []
    for _ in range(5):
        backoff_failed(backoff, subject, backend=backend, now=t)  # this one starts a wait
        with pytest.raises(RateLimited) as refused:
            backoff_failed(backoff, subject, backend=backend, now=t + 0.5)
        waits.append(refused.value.retry_after)
        with pytest.raises(RateLimited):
            backoff_check(backoff, subject, backend=backend, now=t + 0.5)
        # Refused attempts did not count: the wait ends when the counted failure said.
        t += backoff.delay(3 + len(waits) - 1)
        backoff_check(backoff, subject, backend=backend, now=t)
    assert waits == [1, 2, 4, 4, 4]
    backoff_clear(backoff, subject, backend=backend)
    for _ in range(2):
        backoff_failed(backoff, subject, backend=backend, now=t)
    backoff_check(backoff, subject, backend=backend, now=t)  # cleared: free failures again


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_accounts_failures_are_forgotten_a_window_after_its_last_wait(transactional_db, backend):
    backoff = Backoff("test-delay", 1, 10, 10, 60)
    subject = uuid.uuid4().hex
    t = float(int(time.time()))
    backoff_failed(backoff, subject, backend=backend, now=t)
    backoff_failed(backoff, subject, backend=backend, now=t)  # the second waits 10 s
    later = t + 10 + 60 + 1
    backoff_failed(backoff, subject, backend=backend, now=later)  # free again
    backoff_check(backoff, subject, backend=backend, now=later)


def test_the_database_window_starts_again_when_it_has_ended(transactional_db):
    limit = Limit("test", 1, 60)
    subject = uuid.uuid4().hex
    t = float(int(time.time()))
    failure_count([(limit, subject)], backend="database", now=t)
    with pytest.raises(RateLimited):
        failure_count([(limit, subject)], backend="database", now=t)
    with pytest.raises(RateLimited):
        limit_check([(limit, subject)], backend="database", now=t)
    limit_check([(limit, subject)], backend="database", now=t + 61)
    failure_count([(limit, subject)], backend="database", now=t + 61)
    assert RateCounter.objects.get(key=f"ratelimit:test:{subject}").count == 1


def test_a_failure_counts_against_every_subject_it_names(transactional_db):
    account, address = Limit("acct", 100, 120), Limit("addr", 1, 120)
    who, where = uuid.uuid4().hex, uuid.uuid4().hex
    failure_count([(account, who), (address, where)], backend="database")
    with pytest.raises(RateLimited):
        failure_count([(account, who), (address, where)], backend="database")
    assert RateCounter.objects.get(key=f"ratelimit:acct:{who}").count == 2


def test_while_redis_is_away_failures_are_counted_in_the_database(transactional_db, monkeypatch):
    import redis

    from runtime import ratelimits
    from tests.conftest import free_port

    # As the runtime makes its client (from the URL): a refused connection fails at once (a
    # client built with a connect timeout retries with backoff, seconds per call).
    away = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setattr(ratelimits, "_redis", lambda: away)
    limit = Limit("test", 2, 120)
    backoff = Backoff("test-delay", 0, 30, 60, 120)
    subject = uuid.uuid4().hex
    for _ in range(2):
        failure_count([(limit, subject)], backend="redis")
    with pytest.raises(RateLimited):
        failure_count([(limit, subject)], backend="redis")
    with pytest.raises(RateLimited):
        limit_check([(limit, subject)], backend="redis")
    backoff_failed(backoff, subject, backend="redis")
    with pytest.raises(RateLimited):
        backoff_check(backoff, subject, backend="redis")
    assert RateCounter.objects.get(key=f"ratelimit:test:{subject}").count == 2
    assert RateCounter.objects.get(key=f"ratelimit:test-delay:{subject}").count == 1
