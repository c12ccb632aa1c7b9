"""Plain Celery calling an HTTP API, for `make bench`'s HTTP tools' part (BENCH_PARTS=http): a
task that POSTs to the bench's receiver (deploy/bench_receiver.py) with httpx and an
``Idempotency-Key``, run by a thread pool (``-P threads -c TOOL_SLOTS``, as many worker
processes as the console's), Celery's defaults otherwise (early acknowledgement, prefetch 4),
results ignored, on the same Redis broker as the console.

The driver learns that a call was made from one Redis INCR per task, as for the no-op peer
(deploy/bench_celery.py). One httpx client per process, shared by its threads, keeps a
connection per thread alive. The worker runs as `celery -A bench_celery_http worker` with
deploy/ on the path.
"""

from __future__ import annotations

import os
import threading

import httpx
import redis
from celery import Celery

QUEUE = "bench_http"
COUNTER = "bench:http:done"
FAILED = "bench:http:failed"

app = Celery("bench_http", broker=os.environ["REDIS_URL"], set_as_current=False)
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
)

_made = threading.Lock()
_clients: tuple[httpx.Client, redis.Redis] | None = None


def _shared() -> tuple[httpx.Client, redis.Redis]:
    global _clients
    with _made:
        if _clients is None:
            slots = int(os.environ.get("TOOL_SLOTS", "128"))
            limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
            _clients = (
                httpx.Client(limits=limits, timeout=10),
                redis.Redis.from_url(os.environ["REDIS_URL"]),
            )
        return _clients


@app.task(name="bench.http_call", ignore_result=True)
def http_call(url: str, key: str, i: int) -> None:
    client, counter = _shared()
    try:
        client.post(url, json={"i": i}, headers={"Idempotency-Key": key}).raise_for_status()
    except httpx.HTTPError:
        counter.incr(FAILED)
        raise
    counter.incr(COUNTER)


@app.task(name="bench.http_noop", ignore_result=True)
def noop() -> None:
    _shared()[1].incr(COUNTER)
