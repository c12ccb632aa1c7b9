"""`make bench`: durable operations per second through the whole path on PostgreSQL and Redis.

An agent-side loop proposes demo.echo operations (propose commit: operation + event + outbox),
real Celery worker processes claim (commit 2) and accept (commit 3) them. Measured: throughput
from the first proposal to the last acceptance, proposal-to-acceptance latency, and database
write commits per operation (transaction ids assigned). Ends with one line:

    RESULT ops=N seconds=S ops_per_s=X p50_ms=A p99_ms=B commits_per_op=C workers=W

Knobs: BENCH_OPS (default 2000), BENCH_TASKS (default 20), WORKERS (default 2).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _database_url() -> str:
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agent_console")
    parsed = urlparse(base)
    return parsed._replace(path="/agent_console_bench").geturl()


def _ensure_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (parsed.path.lstrip("/"),)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{parsed.path.lstrip("/")}"')


def main() -> int:
    url = _database_url()
    _ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
    os.environ["CELERY_QUEUE"] = "bench"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    env = dict(os.environ)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True
    )

    import django

    django.setup()
    import redis
    from django.db import connection

    from runtime.actors import actor_for_agent
    from runtime.models import Event, Operation
    from runtime.operations import OperationSpec, operation_propose
    from runtime.tasks import TaskSpec, task_create
    from runtime.tokens import token_issue_for_agent

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    total = int(os.environ.get("BENCH_OPS", "2000"))
    task_count = int(os.environ.get("BENCH_TASKS", "20"))
    workers = int(os.environ.get("WORKERS", "2"))

    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "bench"),
            *("--pool", "prefork", "--concurrency", str(workers), "--loglevel", "WARNING"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        issued = token_issue_for_agent(f"bench-{os.getpid()}")
        assert issued.token.agent is not None
        actor = actor_for_agent(issued.token.agent.pk, issued.token.agent.name)
        tasks = [task_create(actor, TaskSpec(name=f"bench {i}")) for i in range(task_count)]
        # Warm-up: the workers are up once one operation went through.
        warm, _ = operation_propose(
            actor, tasks[0].pk, OperationSpec(tool="demo.echo", step="warm", params={})
        )
        while Operation.objects.get(pk=warm.pk).status != "succeeded":
            time.sleep(0.1)

        def commits() -> int:
            # Transaction ids are assigned only to transactions that write, so their advance
            # counts write commits (reads in autocommit do not count).
            with connection.cursor() as cur:
                cur.execute("SELECT pg_current_xact_id()::text::bigint")
                return int(cur.fetchone()[0])

        before = commits()
        started = time.perf_counter()
        ids = []
        for i in range(total):
            op, _ = operation_propose(
                actor,
                tasks[i % task_count].pk,
                OperationSpec(tool="demo.echo", step=f"s{i}", params={"i": i}),
            )
            ids.append(op.pk)
        task_ids = [t.pk for t in tasks]
        done = Operation.objects.filter(task_id__in=task_ids, status="succeeded")
        while done.count() < total + 1:
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        commit_delta = commits() - before - 1

        proposed = dict(
            Event.objects.filter(operation_id__in=ids, type="operation.proposed").values_list(
                "operation_id", "at"
            )
        )
        accepted = dict(
            Event.objects.filter(operation_id__in=ids, type="operation.succeeded").values_list(
                "operation_id", "at"
            )
        )
        latencies = sorted(
            (accepted[i] - proposed[i]).total_seconds() * 1000 for i in ids if i in accepted
        )
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(
            f"RESULT ops={total} seconds={seconds:.2f} ops_per_s={total / seconds:.1f} "
            f"p50_ms={p50:.1f} p99_ms={p99:.1f} commits_per_op={commit_delta / total:.2f} "
            f"workers={workers}"
        )
        return 0
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


if __name__ == "__main__":
    raise SystemExit(main())
