"""The DBOS Transact side of `make bench`, in processes of its own (DBOS configures logging and
its own SQLAlchemy engine, which has no business inside Django's).

Single-step durable workflows on the same PostgreSQL server, with DBOS's own system database
there. deploy/bench.py measures DBOS's configurations side by side and counts the best:
- ``direct URL WORKFLOWS THREADS``: THREADS threads call the workflow synchronously, so a
  workflow counts once its result is durable. The driver starts one such process or as many as
  our worker processes; each prints ``ready`` once launched and warm, then reads the common
  start time (epoch seconds) on stdin, and prints {"count": N, "end": epoch seconds}.
- ``worker URL CONCURRENCY POLL``: a process that runs workflows from the queue ``bench`` (at
  most CONCURRENCY at once, polling every POLL seconds); prints ``ready``, runs until stdin
  closes.
- ``enqueue URL WORKFLOWS PREFIX``: the separate enqueuer (a DBOSClient, as an application
  that hands work to DBOS workers would hold), enqueueing WORKFLOWS workflows with ids
  PREFIX-n from one thread after reading the start time on stdin; prints {"end": ...}. The
  driver reads completion from DBOS's workflow_status table.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions

APP = "agent-console-bench"
QUEUE = "bench"


def launch(url: str, pool: int) -> None:
    config: DBOSConfig = {
        "name": APP,
        "system_database_url": url,
        # One pooled connection per calling thread, plus DBOS's own background readers.
        "sys_db_pool_size": pool + 4,
        "log_level": "WARNING",
    }
    DBOS(config=config)


@DBOS.step()
def echo_step(value: int) -> int:
    return value


@DBOS.workflow()
def one_step(value: int) -> int:
    return echo_step(value)


def wait_start() -> float:
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    delay = start - time.time()
    if delay > 0:
        time.sleep(delay)
    return start


def direct(url: str, total: int, threads: int) -> None:
    launch(url, threads)
    DBOS.launch()
    try:
        for i in range(20):  # warm-up: pool connections, prepared plans
            one_step(i)
        per_thread = max(1, total // threads)
        wait_start()

        def run(count: int) -> None:
            for i in range(count):
                one_step(i)

        workers = [threading.Thread(target=run, args=(per_thread,)) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print(json.dumps({"count": per_thread * threads, "end": time.time()}), flush=True)
    finally:
        DBOS.destroy()


def worker(url: str, concurrency: int, poll: float) -> None:
    launch(url, concurrency)
    DBOS.launch()
    try:
        # Queues live in the system database (registered once launched): each worker writes
        # the round's settings, the same in every process of a configuration.
        DBOS.register_queue(
            QUEUE,
            worker_concurrency=concurrency,
            polling_interval_sec=poll,
            on_conflict="always_update",
        )
        print("ready", flush=True)
        sys.stdin.read()  # until the driver closes it
    finally:
        DBOS.destroy()


def enqueue(url: str, total: int, prefix: str) -> None:
    client = DBOSClient(system_database_url=url, application_name=APP)
    try:
        options: EnqueueOptions = {"workflow_name": one_step.__qualname__, "queue_name": QUEUE}
        client.enqueue({**options, "workflow_id": f"{prefix}-warm"}, -1)
        wait_start()
        for i in range(total):
            client.enqueue({**options, "workflow_id": f"{prefix}-{i}"}, i)
        print(json.dumps({"end": time.time()}), flush=True)
    finally:
        client.destroy()


def main() -> int:
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "direct":
        direct(url, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "worker":
        worker(url, int(sys.argv[3]), float(sys.argv[4]))
    elif mode == "enqueue":
        enqueue(url, int(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
