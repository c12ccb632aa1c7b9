"""Brute-force limits count on atomic counters: of N attempts made at the same moment from N
threads, exactly the limit gets through, in Redis (services mode) and in the database (embedded
mode's guarded UPDATE, here on PostgreSQL with real concurrent transactions)."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runtime.models import RateCounter
from runtime.ratelimits import Limit, RateLimited, attempt_begin, attempt_succeeded

pytestmark = [pytest.mark.postgres]

THREADS = 16
LIMIT = 5


def _race(backend: str, limit: Limit, subject: str) -> tuple[int, list[int]]:
    barrier = threading.Barrier(THREADS)
    passed: list[int] = []
    retry_after: list[int] = []
    lock = threading.Lock()

    def attempt() -> None:
        try:
            barrier.wait(timeout=30)
            try:
                attempt_begin([(limit, subject)], backend=backend)
            except RateLimited as exc:
                with lock:
                    retry_after.append(exc.retry_after)
            else:
                with lock:
                    passed.append(1)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return len(passed), retry_after


@pytest.mark.parametrize("backend", ["redis", "database"])
def test_concurrent_attempts_never_overshoot_the_limit(transactional_db, backend):
    limit = Limit("test", LIMIT, 120)
    passed, refused = _race(backend, limit, uuid.uuid4().hex)
    assert passed == LIMIT
    assert len(refused) == THREADS - LIMIT
    assert all(1 <= r <= 120 for r in refused)


@pytest.mark.parametrize("backend", ["redis", "database"])
def test_a_successful_attempt_gives_its_slot_back(transactional_db, backend):
    limit = Limit("test", 2, 120)
    subject = uuid.uuid4().hex
    for _ in range(5):
        attempt_succeeded(attempt_begin([(limit, subject)], backend=backend))
    attempt_begin([(limit, subject)], backend=backend)
    attempt_begin([(limit, subject)], backend=backend)
    with pytest.raises(RateLimited):
        attempt_begin([(limit, subject)], backend=backend)


def test_a_refusal_on_one_subject_gives_back_the_slots_taken_on_the_others(transactional_db):
    account, address = Limit("acct", 100, 120), Limit("addr", 1, 120)
    who, where = uuid.uuid4().hex, uuid.uuid4().hex
    attempt_begin([(account, who), (address, where)], backend="database")
    with pytest.raises(RateLimited):
        attempt_begin([(account, who), (address, where)], backend="database")
    assert RateCounter.objects.get(key=f"ratelimit:acct:{who}").count == 1


def test_the_database_window_starts_again_when_it_has_ended(transactional_db):
    limit = Limit("test", 1, 60)
    subject = uuid.uuid4().hex
    attempt_begin([(limit, subject)], backend="database")
    with pytest.raises(RateLimited):
        attempt_begin([(limit, subject)], backend="database")
    later = timezone.now() + timedelta(seconds=61)
    attempt_begin([(limit, subject)], backend="database", now=later)
