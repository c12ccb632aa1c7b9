"""The per-worker Redis database of `make pytest`'s worker processes (tests/xdist_env.py)."""

from __future__ import annotations

import pytest

from tests.xdist_env import worker_redis_url


def test_each_worker_gets_its_own_redis_database_below_the_given_one():
    url = "redis://127.0.0.1:6379/15"
    assert worker_redis_url(url, "gw0") == url
    assert worker_redis_url(url, "gw1") == "redis://127.0.0.1:6379/14"
    assert worker_redis_url("redis://:pw@host:1/3", "gw2") == "redis://:pw@host:1/1"
    assert worker_redis_url("redis://host", "gw0") == "redis://host/0"


def test_a_worker_without_a_database_of_its_own_is_refused():
    with pytest.raises(RuntimeError, match="too few Redis databases"):
        worker_redis_url("redis://127.0.0.1:6379/1", "gw2")
