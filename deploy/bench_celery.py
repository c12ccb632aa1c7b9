"""Plain Celery for `make bench`: a no-op task with `ignore_result`, Celery's defaults otherwise
(prefork, early acknowledgement, prefetch 4), on the same Redis broker as the durable path.

Results are ignored, so the driver learns that the tasks ran from one Redis INCR per task (about
a tenth of a millisecond, counted in plain Celery's time, so its figure is a little pessimistic).
The worker runs as `celery -A bench_celery worker` with deploy/ on the path. The same worker
processes run the drf_celery peer's task (``peer_done``), sent by deploy/bench_peers.py's view.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import redis
from celery import Celery

QUEUE = "bench_noop"
COUNTER = "bench:noop:done"

# Not the process's current app: the bench's driver also proposes through the console's app
# (runtime.worker's shared tasks follow the current app), between plain Celery's rounds.
app = Celery("bench_noop", broker=os.environ["REDIS_URL"], set_as_current=False)
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
)

_redis: redis.Redis | None = None


@app.task(name="bench.noop", ignore_result=True)
def noop() -> None:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["REDIS_URL"])
    _redis.incr(COUNTER)


_db: Any = None


@app.task(name="bench.peer_done", ignore_result=True)
def peer_done(row_id: int) -> None:
    """The non-durable peer's worker side (issue 37, deploy/bench_peers.py): the row the view
    inserted is marked done, one autocommitted UPDATE on a connection the process keeps."""
    global _db
    if _db is None:
        _db = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    _db.execute("UPDATE bench_peer SET done_at = clock_timestamp() WHERE id = %s", [row_id])
