"""WAL per operation of the one-operation path, by relation (issue 37): N proposals of
``demo.slow`` (0 s) through the REST view in this process (Django's handler with the console's
middleware, an Idempotency-Key each), each run at once by the worker's task body (claim, call,
acceptance); the WAL between the first and the last (pg_walinspect), records of this database
only, grouped by the relation they wrote (heap or index), with their full-page images apart;
and the operation table's updates and HOT updates (pg_stat_user_tables) over the same window.

    DATABASE_URL=postgres://.../agent_console_bench REDIS_URL=redis://127.0.0.1:6379/3 \
        BENCH_WAL_OPS=200 .venv/bin/python deploy/bench_wal.py

A database whose name lacks ``bench`` is refused, as `make bench` refuses it; migrate it first
(`make bench` does). No worker runs: the Celery messages the proposals send stay in Redis (the
bench's own Redis db is flushed at the end, as deploy/bench.py does). No timing: this counts.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
sys.path[:0] = [str(DEPLOY), str(DEPLOY.parent)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

_REL = re.compile(r"rel \d+/(\d+)/(\d+)")


def main() -> int:
    import bench  # the bench's own helpers (the database check, agents, tasks)

    bench.bench_database_url()
    import django

    django.setup()
    from django.db import connection
    from django.test import Client

    from runtime.worker import execute_operation

    n = int(os.environ.get("BENCH_WAL_OPS", "200"))
    agent = bench.bench_agent("bench-wal")
    task_id = bench.new_tasks(agent, 1, "wal")[0]
    http = Client(HTTP_AUTHORIZATION=f"Bearer {agent.secret}", HTTP_HOST="127.0.0.1")

    def one(step: str) -> None:
        response = http.post(
            f"/api/v1/tasks/{task_id}/operations",
            {"tool": bench.HEADLINE_TOOL, "step": step, "params": bench.HEADLINE_PARAMS},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=step,
        )
        assert response.status_code == 201, response.content[:300]
        assert execute_operation(response.json()["id"]) == "succeeded"

    for _ in range(20):  # warm: this execution registered, caches filled
        one(f"wal-warm-{uuid.uuid4().hex}")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_current_wal_flush_lsn()::text, oid FROM pg_database "
            "WHERE datname = current_database()"
        )
        start, db = cur.fetchone()
    updates0 = _operation_updates()
    for i in range(n):
        one(f"wal-{i}-{uuid.uuid4().hex[:8]}")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_flush_lsn()::text")
        end = cur.fetchone()[0]
        cur.execute(
            "SELECT resource_manager, record_length, fpi_length, block_ref, xid::text "
            "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)",
            [start, end],
        )
        rows = cur.fetchall()
        cur.execute(
            "SELECT pg_relation_filenode(oid), relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL"
        )
        names = {int(node): name for node, name in cur.fetchall()}
    updates = [b - a for a, b in zip(updates0, _operation_updates(), strict=True)]
    bench.flush_redis()
    written, fpi, records = Counter[str](), Counter[str](), Counter[str]()
    xids: set[str] = set()
    for _rmgr, length, image, refs, xid in rows:
        ours = [node for d, node in _REL.findall(refs or "") if int(d) == db]
        if ours:
            name = names.get(int(ours[0]), ours[0])
            written[name] += length
            fpi[name] += image
            records[name] += 1
            xids.add(xid)
    commits = sum(r[1] for r in rows if r[0] == "Transaction" and r[4] in xids)
    total = sum(written.values()) + commits
    print(
        f"{n} operations: {total / n / 1024:.2f} KB of WAL per operation "
        f"({sum(fpi.values()) / n / 1024:.2f} KB of it full-page images, commit records "
        f"{commits / n:.0f} B); runtime_operation updates {updates[0]}, HOT {updates[1]}"
    )
    for name, size in written.most_common():
        print(
            f"  {name:48s} {size / n:7.0f} B/op  (images {fpi[name] / n:5.0f})  "
            f"records {records[name] / n:.2f}"
        )
    return 0


def _operation_updates() -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)  # a backend reports its counts at most once a second
    with connection.cursor() as cur:
        cur.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'runtime_operation'"
        )
        upd, hot = cur.fetchone()
    return int(upd), int(hot)


if __name__ == "__main__":
    raise SystemExit(main())
