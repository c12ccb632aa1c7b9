"""Loaded with ``-p tests.xdist_env`` before pytest-django reads the settings: under
pytest-xdist each worker process gets a Redis database of its own (the next lower number per
worker), as pytest-django gives it a test database of its own (``_gw<N>``). The broker queues,
the channel layer and the rate-limit counters of one worker are then never another's, and the
Celery workers and web servers a test starts inherit the URL (tests.conftest.service_env)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit


def worker_redis_url(url: str, worker: str) -> str:
    """``url`` with its database number lowered by the worker's index (gw0 keeps it). Pure."""
    index = int(worker.removeprefix("gw"))
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    if index > base:
        raise RuntimeError(f"{url}: too few Redis databases below it for worker {worker}")
    return urlunsplit(parts._replace(path=f"/{base - index}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], _worker)
