"""The DBOS Transact side of `make bench`, run by deploy/bench.py in a process of its own (DBOS
configures logging and its own SQLAlchemy engine, which has no business inside Django's).

Single-step durable workflows per second on the same PostgreSQL server, with DBOS's own system
database there. Each thread calls the workflow synchronously, so a workflow counts once its
result is durable. Prints one JSON line: {"rounds": [workflows per second, ...], ...}.

Usage: bench_dbos.py SYSTEM_DATABASE_URL WORKFLOWS THREADS ROUNDS
"""

from __future__ import annotations

import json
import sys
import threading
import time


def _vacuum(url: str) -> None:
    """VACUUM ANALYZE DBOS's system database before a round, as the durable path's tables are
    (deploy/bench.py:vacuum): both start each round from the same state."""
    import psycopg

    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as conn:
        conn.execute("VACUUM (ANALYZE)")


def main() -> int:
    url, total, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "agent-console-bench",
        "system_database_url": url,
        # One pooled connection per calling thread, plus DBOS's own background readers.
        "sys_db_pool_size": threads + 4,
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def echo_step(value: int) -> int:
        return value

    @DBOS.workflow()
    def one_step(value: int) -> int:
        return echo_step(value)

    DBOS.launch()
    try:
        for i in range(20):  # warm-up: pool connections, prepared plans
            one_step(i)
        results = []
        for _ in range(rounds):
            _vacuum(url)
            per_thread = max(1, total // threads)
            barrier = threading.Barrier(threads + 1)

            def run(count: int, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                for i in range(count):
                    one_step(i)

            workers = [threading.Thread(target=run, args=(per_thread,)) for _ in range(threads)]
            for w in workers:
                w.start()
            barrier.wait()
            started = time.perf_counter()
            for w in workers:
                w.join()
            seconds = time.perf_counter() - started
            results.append(per_thread * threads / seconds)
        print(
            json.dumps({"rounds": results, "threads": threads, "workflows": per_thread * threads})
        )
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
