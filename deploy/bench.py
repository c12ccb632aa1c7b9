"""`make bench`: the durable path side by side with plain Celery and DBOS Transact, in one run, on
the same PostgreSQL server and Redis, with the same number of worker processes.

Parts (each figure the median of BENCH_ROUNDS rounds unless said otherwise):
- ours: durable fenced ``demo.echo`` operations per second end to end (proposal to accepted)
  with real Celery worker processes; p50/p99 latency from a paced proposer at half the measured
  peak; write commits per operation from the WAL's commit records during the burst (class
  WriteCommits); SQL statements (and write commits, counted in-process as a cross-check) per
  operation from a sample run through
  propose -> claim -> invoke -> report in this process, the same code the workers run;
- plain Celery: no-op tasks per second (deploy/bench_celery.py), ``ignore_result``, prefork;
- DBOS Transact: single-step workflows per second (deploy/bench_dbos.py), its own system
  database on the same server, BENCH_DBOS_THREADS threads (default 4 per worker process);
- REST: proposals per second over HTTP from BENCH_API_CLIENTS clients against the app's web
  server (console.server, started by ``serve_app``), each POST with an ``Idempotency-Key``; p99;
  write commits per proposal likewise from the WAL;
- reads: p99 ms of the task list and of one task's timeline with BENCH_READ_EVENTS journal events
  (default 1,000,000, seeded once by generate_series and kept in the bench database);
- the chart: ours and plain Celery against worker processes (BENCH_CHART_WORKERS, 1,2,4).

Ours, plain Celery and DBOS take turns round by round (ours, Celery, DBOS, then again), and the
ratios are the medians of each round's own ratios: on a shared host a noisy minute then falls
on all three alike instead of on whichever part ran in it.

It ends with one line (see the performance issue for the keys):

    RESULT ops_per_s=.. celery_ops_per_s=.. dbos_ops_per_s=.. ratio_vs_celery=.. ...

and writes var/bench/report.md with var/bench/throughput.svg. BENCH_QUICK=1 runs every part small
(well under a minute once the read data is seeded; BENCH_READ_EVENTS=20000 by default there).

Knobs: WORKERS (2), BENCH_ROUNDS (5), BENCH_OPS (2000 per round),
BENCH_PROPOSERS (as many as BENCH_DBOS_THREADS), BENCH_TASKS (20 per round),
BENCH_PACED_SECONDS (8), BENCH_SAMPLE (40 operations for the counts),
BENCH_CELERY_TASKS (3000), BENCH_DBOS_WORKFLOWS (1500), BENCH_DBOS_THREADS (4 x WORKERS),
BENCH_API_REQUESTS (600), BENCH_API_CLIENTS (8), BENCH_READ_EVENTS (1000000),
BENCH_READ_TASKS (10000), BENCH_READ_REQUESTS (200), BENCH_CHART_WORKERS ("1,2,4"),
BENCH_CHART_OPS (BENCH_OPS / 2), BENCH_TIMEOUT (300 s for one round to drain),
BENCH_OUT (var/bench).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DEPLOY))

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
QUEUE = "bench"


def knob(name: str, default: int, quick: int) -> int:
    return int(os.environ.get(name, quick if QUICK else default))


WORKERS = int(os.environ.get("WORKERS", "2"))
ROUNDS = knob("BENCH_ROUNDS", 5, 1)
OPS = knob("BENCH_OPS", 2000, 60)
TASKS_PER_ROUND = knob("BENCH_TASKS", 20, 5)
PACED_SECONDS = knob("BENCH_PACED_SECONDS", 8, 2)
SAMPLE = knob("BENCH_SAMPLE", 40, 10)
CELERY_TASKS = knob("BENCH_CELERY_TASKS", 3000, 300)
DBOS_WORKFLOWS = knob("BENCH_DBOS_WORKFLOWS", 1500, 100)
DBOS_THREADS = knob("BENCH_DBOS_THREADS", 4 * WORKERS, 4 * WORKERS)
# Ours gets as many concurrent callers as DBOS has threads calling its workflows. With 2, the
# bench's own proposers were the bottleneck (their proposal rate was the durable rate in every
# round, the report's last line), so the figure measured the load generator, not the path.
PROPOSERS = knob("BENCH_PROPOSERS", DBOS_THREADS, DBOS_THREADS)
API_REQUESTS = knob("BENCH_API_REQUESTS", 600, 80)
API_CLIENTS = knob("BENCH_API_CLIENTS", 8, 4)
READ_EVENTS = knob("BENCH_READ_EVENTS", 1_000_000, 20_000)
READ_TASKS = knob("BENCH_READ_TASKS", 10_000, 200)
READ_REQUESTS = knob("BENCH_READ_REQUESTS", 200, 30)
CHART_OPS = knob("BENCH_CHART_OPS", max(OPS // 2, 1), max(OPS // 2, 1))
TIMEOUT = knob("BENCH_TIMEOUT", 300, 120)
CHART_WORKERS = [
    int(w) for w in os.environ.get("BENCH_CHART_WORKERS", "1,2" if QUICK else "1,2,4").split(",")
]
OUT = Path(os.environ.get("BENCH_OUT", str(ROOT / "var" / "bench")))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


# --- services -----------------------------------------------------------------------------------


def bench_database_url() -> str:
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agent_console_bench")
    name = urlparse(url).path.lstrip("/")
    if "bench" not in name:
        # The bench writes a million rows and flushes its Redis db: never someone else's.
        raise SystemExit(f"refusing to benchmark on database {name!r}: its name must say bench")
    return url


def ensure_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a process this script started (and only that one)."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def celery_worker(
    app: str, queue: str, concurrency: int, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queue),
            *("--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "WARNING"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *("-n", f"{app}-{uuid.uuid4().hex[:8]}@%h"),
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": f"{DEPLOY}{os.pathsep}{ROOT}"},
        # The banner and the root warning are noise here; errors stay in var/bench/processes.log.
        stdout=subprocess.DEVNULL,
        stderr=process_log(),
    )


def process_log() -> Any:
    OUT.mkdir(parents=True, exist_ok=True)
    return (OUT / "processes.log").open("ab")


def serve_app(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The one place the bench starts the app's web server: console.server (uvicorn, with its
    pool of database connections), as `make run` and deploy/ start it."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "console.server", "--host", "127.0.0.1"),
            *("--port", str(port)),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=process_log(),
    )


def wait_until(check: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


# --- statement and commit counts ----------------------------------------------------------------

_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b|\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b", re.I)


@dataclass
class SqlCount:
    """Every statement one connection sends, and the commits that wrote (a transaction that
    inserted, updated, deleted or locked rows is the one PostgreSQL gives a transaction id)."""

    statements: int = 0
    write_commits: int = 0
    verbs: Counter[str] = field(default_factory=Counter)
    _wrote: bool = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
        self.statements += 1
        self.verbs[verb] += 1
        if _WRITE.search(sql) and verb not in ("SAVEPOINT", "RELEASE"):
            if context["connection"].in_atomic_block:
                self._wrote = True
            else:
                self.write_commits += 1  # autocommit: the statement is its own transaction
        return execute(sql, params, many, context)

    def committed(self) -> None:
        if self._wrote:
            self.write_commits += 1
        self._wrote = False

    def rolled_back(self) -> None:
        self._wrote = False


@contextmanager
def counting(connection: Any) -> Iterator[SqlCount]:
    count = SqlCount()
    commit, rollback = connection.commit, connection.rollback

    def counted_commit() -> None:
        commit()
        count.committed()

    def counted_rollback() -> None:
        rollback()
        count.rolled_back()

    connection.commit, connection.rollback = counted_commit, counted_rollback
    try:
        with connection.execute_wrapper(count):
            yield count
    finally:
        del connection.commit, connection.rollback


class WriteCommits:
    """Write commits on the whole server since it was made: the commit records in the WAL
    (pg_walinspect, PostgreSQL 15+). A transaction that wrote nothing writes none, and a
    savepoint's subtransaction is part of its parent's record, where counting transaction ids
    would count it again (the REST path's proposal runs in a savepoint of the request's
    transaction). Without pg_walinspect, the advance of transaction ids is the count."""

    def __init__(self) -> None:
        from django.db import connection

        with connection.cursor() as cur:
            try:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                cur.execute("SELECT pg_current_wal_flush_lsn()::text")
                self.lsn: str | None = str(cur.fetchone()[0])
            except Exception:
                self.lsn = None
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            self.xid = int(cur.fetchone()[0])
        self.source = "WAL commit records" if self.lsn else "transaction ids"

    def count(self) -> int:
        from django.db import connection

        with connection.cursor() as cur:
            if self.lsn is not None:
                cur.execute(
                    "SELECT count(*) FROM pg_get_wal_records_info(%s::pg_lsn, "
                    "pg_current_wal_flush_lsn()) WHERE resource_manager = 'Transaction' "
                    "AND record_type LIKE 'COMMIT%%'",
                    [self.lsn],
                )
                return int(cur.fetchone()[0])
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            return int(cur.fetchone()[0]) - self.xid


# --- ours ---------------------------------------------------------------------------------------


@dataclass
class Agent:
    actor: Any
    secret: str


def bench_agent(name: str) -> Agent:
    """An agent and a fresh token for it (the agent is reused across runs, by name)."""
    from runtime.actors import actor_for_agent
    from runtime.tokens import token_issue_for_agent

    issued = token_issue_for_agent(name)
    assert issued.token.agent is not None
    return Agent(actor_for_agent(issued.token.agent.pk, issued.token.agent.name), issued.secret)


def new_tasks(agent: Agent, count: int, label: str) -> list[str]:
    from runtime.tasks import TaskSpec, task_create

    return [task_create(agent.actor, TaskSpec(name=f"bench {label} {i}")).pk for i in range(count)]


def propose(agent: Agent, task_id: str, step: str) -> str:
    from runtime.operations import OperationSpec, operation_propose

    op, _ = operation_propose(
        agent.actor, task_id, OperationSpec(tool="demo.echo", step=step, params={"step": step})
    )
    return str(op.pk)


def succeeded_count(task_ids: list[str]) -> int:
    from runtime.models import Operation

    return Operation.objects.filter(task_id__in=task_ids, status="succeeded").count()


def wait_drained(task_ids: list[str], total: int) -> None:
    """Until the round's ``total`` operations succeeded. It polls the round's task rows, whose
    maintained counter of active operations is a primary-key read of 20 rows, and counts the
    operations once at the end: counting them every poll (a scan of the round's operations,
    planned anew each time) cost PostgreSQL 3 ms per poll, a sixth of a core taken from the
    path it measures (plain Celery's driver reads one Redis counter)."""
    from runtime.models import Operation, Task

    deadline = time.monotonic() + TIMEOUT
    busy = Task.objects.filter(pk__in=task_ids, ops_active__gt=0)
    while busy.exists() and time.monotonic() <= deadline:
        time.sleep(0.02)
    while succeeded_count(task_ids) < total:
        if time.monotonic() > deadline:
            stuck = Counter(
                Operation.objects.filter(task_id__in=task_ids).values_list("status", flat=True)
            )
            raise SystemExit(f"bench: operations did not drain in {TIMEOUT} s: {dict(stuck)}")
        time.sleep(0.02)


# The tables every operation churns (an update of each row per transition, an outbox row in and
# out per operation).
_HOT_TABLES = (
    "runtime_operation, runtime_task, runtime_taskcount, runtime_outboxmessage, "
    "runtime_invocation, runtime_event, runtime_rejectedobservation"
)


def vacuum() -> None:
    """VACUUM ANALYZE the hot tables before a measured part, as autovacuum would have between
    the bench's parts on a server that runs it (this machine's PostgreSQL has it off): each
    part then starts from the same state instead of from the dead rows of the last, which
    slowed every later round and made the queue's plans go stale."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"VACUUM (ANALYZE) {_HOT_TABLES}")


def ours_burst(agent: Agent, total: int, label: str) -> dict[str, float]:
    """Propose ``total`` operations from BENCH_PROPOSERS threads as fast as they go; the clock
    runs from the first proposal to the last acceptance."""
    from django.db import connection

    vacuum()

    task_ids = new_tasks(agent, TASKS_PER_ROUND, label)
    writes = WriteCommits()
    barrier = threading.Barrier(PROPOSERS + 1)

    def proposer(k: int) -> None:
        try:
            barrier.wait()
            for i in range(k, total, PROPOSERS):
                propose(agent, task_ids[i % len(task_ids)], f"{label}-{i}")
        finally:
            connection.close()

    threads = [threading.Thread(target=proposer, args=(k,)) for k in range(PROPOSERS)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    proposed = time.perf_counter() - started
    wait_drained(task_ids, total)
    seconds = time.perf_counter() - started
    commits = writes.count()
    return {
        "ops_per_s": total / seconds,
        "seconds": seconds,
        "propose_per_s": total / proposed,
        "commits_per_op": commits / total,
    }


def acceptance_times(op_ids: list[str]) -> dict[str, datetime]:
    from runtime.models import Event, Operation

    found = dict(
        Event.objects.filter(operation_id__in=op_ids, type="operation.succeeded").values_list(
            "operation_id", "at"
        )
    )
    missing = [i for i in op_ids if i not in found]
    if missing:  # should the journal name acceptance otherwise, the row's last write is it
        found.update(Operation.objects.filter(pk__in=missing).values_list("pk", "updated_at"))
    return found


def ours_paced(agent: Agent, rate: float, label: str) -> dict[str, float]:
    """An open-loop proposer at ``rate`` operations per second: latency from the moment the
    proposal is sent to the acceptance's commit time, at a load the path can carry."""
    vacuum()
    task_ids = new_tasks(agent, TASKS_PER_ROUND, label)
    total = max(20, int(rate * PACED_SECONDS))
    interval = 1.0 / rate
    sent: dict[str, float] = {}
    start = time.time()
    for i in range(total):
        due = start + i * interval
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        at = time.time()
        sent[propose(agent, task_ids[i % len(task_ids)], f"{label}-{i}")] = at
    achieved = total / (time.time() - start)
    wait_drained(task_ids, total)
    accepted = acceptance_times(list(sent))
    latencies = [(accepted[i].timestamp() - t) * 1000 for i, t in sent.items() if i in accepted]
    return {
        "rate": rate,
        "achieved_rate": achieved,
        "ops": total,
        "p50_ms": median(latencies),
        "p99_ms": percentile(latencies, 0.99),
    }


def ours_workers(concurrency: int, env: dict[str, str], agent: Agent) -> subprocess.Popen[bytes]:
    flush_redis()
    worker = celery_worker("console", QUEUE, concurrency, env)
    # Up once one operation went through.
    task_id = new_tasks(agent, 1, f"warm-{concurrency}")
    propose(agent, task_id[0], "warm")
    try:
        wait_until(lambda: succeeded_count(task_id) == 1, 90, "the workers to start")
    except BaseException:
        stop(worker)
        raise
    return worker


def ours_counts(agent: Agent) -> dict[str, Any]:
    """Statements and write commits per operation: SAMPLE operations through propose, then the
    worker's task body (claim -> invoke -> report) in this process, no worker running."""
    from django.db import connection

    from runtime.worker import execute_operation

    flush_redis()
    task_id = new_tasks(agent, 1, "counts")[0]
    execute_operation(propose(agent, task_id, "counts-warm"))  # registers this execution
    phases = {"propose": SqlCount(), "execute": SqlCount()}
    verbs: Counter[str] = Counter()
    for i in range(SAMPLE):
        with counting(connection) as c:
            op_id = propose(agent, task_id, f"counts-{i}")
        phases["propose"].statements += c.statements
        phases["propose"].write_commits += c.write_commits
        verbs.update(c.verbs)
        with counting(connection) as c:
            outcome = execute_operation(op_id)
        if outcome != "succeeded":
            raise SystemExit(f"bench: the sampled operation ended {outcome!r}")
        phases["execute"].statements += c.statements
        phases["execute"].write_commits += c.write_commits
        verbs.update(c.verbs)
    flush_redis()  # the proposals' nudges: nobody consumed them
    return {
        "sample": SAMPLE,
        "statements_per_op": sum(p.statements for p in phases.values()) / SAMPLE,
        "commits_per_op": sum(p.write_commits for p in phases.values()) / SAMPLE,
        "phases": {
            name: {"statements": p.statements / SAMPLE, "write_commits": p.write_commits / SAMPLE}
            for name, p in phases.items()
        },
        "verbs": {v: n / SAMPLE for v, n in verbs.most_common()},
    }


# --- plain Celery -------------------------------------------------------------------------------


def celery_pool(concurrency: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Plain Celery's worker pool, up once one no-op ran."""
    import bench_celery
    import redis

    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    r.set(bench_celery.COUNTER, 0)
    worker = celery_worker("bench_celery", bench_celery.QUEUE, concurrency, env)
    try:
        bench_celery.noop.delay()
        wait_until(lambda: int(r.get(bench_celery.COUNTER) or 0) >= 1, 90, "the Celery worker")
    except BaseException:
        stop(worker)
        raise
    return worker


def celery_round(total: int) -> float:
    """``total`` no-op tasks sent as fast as one thread sends them: tasks per second from the
    first send to the last run."""
    import bench_celery
    import redis

    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    r.set(bench_celery.COUNTER, 0)
    started = time.perf_counter()
    for _ in range(total):
        bench_celery.noop.delay()
    wait_until(
        lambda: int(r.get(bench_celery.COUNTER) or 0) >= total,
        TIMEOUT,
        "the no-op tasks",
        every=0.005,
    )
    return total / (time.perf_counter() - started)


def celery_rounds(concurrency: int, env: dict[str, str], rounds: int, total: int) -> list[float]:
    worker = celery_pool(concurrency, env)
    try:
        return [celery_round(total) for _ in range(rounds)]
    finally:
        stop(worker)


# --- DBOS ---------------------------------------------------------------------------------------


def dbos_round() -> float:
    """One round of DBOS workflows, in a process started for it: workflows per second."""
    system_url = urlparse(os.environ["DATABASE_URL"])._replace(
        scheme="postgresql", path="/agent_console_bench_dbos"
    )
    done = subprocess.run(
        [
            *(sys.executable, str(DEPLOY / "bench_dbos.py"), system_url.geturl()),
            *(str(DBOS_WORKFLOWS), str(DBOS_THREADS), "1"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 2,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"bench: the DBOS run failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return float(json.loads(lines[-1])["rounds"][0])


# --- REST and reads -----------------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection, as an agent's client library holds one."""

    def __init__(self, port: int, secret: str) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, float]:
        payload = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):
            started = time.perf_counter()
            try:
                self.conn.request(method, path, payload, {**self.headers, **(headers or {})})
                response = self.conn.getresponse()
                data = response.read()
                return response.status, json.loads(data or b"null"), time.perf_counter() - started
            except (http.client.HTTPException, ConnectionError):
                # The server closed a kept-alive connection: reconnect once.
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def api_client(
    port: int,
    secret: str,
    task_id: str,
    count: int,
    barrier: threading.Barrier,
    errors: list[str],
    latencies: list[float],
) -> None:
    c = Client(port, secret)
    try:
        barrier.wait()
        for i in range(count):
            step = uuid.uuid4().hex
            status, body, seconds = c.request(
                "POST",
                f"/api/v1/tasks/{task_id}/operations",
                {"tool": "demo.echo", "step": step, "params": {"i": i}},
                {"Idempotency-Key": step},
            )
            if status != 201:
                errors.append(f"{status} {body}")
            latencies.append(seconds * 1000)
    finally:
        c.close()


def api_rounds(port: int, agent: Agent) -> dict[str, float]:
    """Proposals over HTTP from API_CLIENTS concurrent clients, each POST with its own
    Idempotency-Key (as a retrying agent sends them). Workers are not running: this is the
    front door's rate, and the WAL's commit records count its write commits."""
    from runtime.cancellation import task_cancel

    rates, latencies, commits = [], [], []
    for r in range(ROUNDS):
        task_ids = new_tasks(agent, API_CLIENTS, f"api-{r}")
        barrier = threading.Barrier(API_CLIENTS + 1)
        errors: list[str] = []
        per_client = max(1, API_REQUESTS // API_CLIENTS)

        threads = [
            threading.Thread(
                target=api_client,
                args=(port, agent.secret, task_id, per_client, barrier, errors, latencies),
            )
            for task_id in task_ids
        ]
        for t in threads:
            t.start()
        writes = WriteCommits()
        barrier.wait()
        started = time.perf_counter()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - started
        commits.append(writes.count() / (per_client * API_CLIENTS))
        if errors:
            raise SystemExit(f"bench: {len(errors)} proposals over HTTP failed, e.g. {errors[0]}")
        rates.append(per_client * API_CLIENTS / seconds)
        # No worker ran these: cancel them through the runtime, so that no later run's workers
        # find them waiting in the queue.
        for task_id in task_ids:
            task_cancel(agent.actor, task_id, "bench: REST round over")
    flush_redis()
    return {
        "api_propose_per_s": median(rates),
        "api_p50_ms": median(latencies),
        "api_p99_ms": percentile(latencies, 0.99),
        "api_commits_per_op": median(commits),
    }


def seed_reads(agent: Agent) -> dict[str, Any]:
    """READ_EVENTS journal events over READ_TASKS tasks of one agent, a tenth of them on one
    long-running task. Rows are cloned in SQL (generate_series) from a task, attempt and event
    that task_create wrote, so every column, constraint and later-added field is the real
    code's; the seed is kept in the bench database and redone only when the knobs change."""
    from django.db import connection, transaction

    from runtime.models import Attempt, Event, Task

    small_tasks = max(1, READ_TASKS - 1)
    per_small = max(1, READ_EVENTS * 9 // 10 // small_tasks)
    big = max(1, READ_EVENTS - per_small * small_tasks)  # about a tenth, and the rest
    total = big + per_small * small_tasks
    marker = f"read-seed {READ_TASKS}x{total}"
    seeded = Task.objects.filter(agent_id=agent.actor.agent_id, name=f"{marker} big").first()
    if seeded is None:
        log(f"seeding {total:,} journal events over {READ_TASKS:,} tasks (once)")
        began = time.perf_counter()
        old = list(Task.objects.filter(agent_id=agent.actor.agent_id).values_list("pk", flat=True))
        with transaction.atomic():
            Task.objects.filter(pk__in=old).update(current_attempt=None)
            Event.objects.filter(task_id__in=old).delete()
            Attempt.objects.filter(task_id__in=old).delete()
            Task.objects.filter(pk__in=old).delete()
        template_id = new_tasks(agent, 1, "read-template")[0]
        template = Task.objects.get(pk=template_id)
        event_id = Event.objects.filter(task_id=template_id).values_list("pk", flat=True)[0]
        prefix = f"tsk_rs{uuid.uuid4().hex[:6]}"
        task_expr = f"'{prefix}' || lpad(g::text, 8, '0')"
        attempt_expr = f"'att_rs' || substr('{prefix}', 7) || lpad(g::text, 8, '0')"
        with transaction.atomic(), connection.cursor() as cur:
            # Task 1 is the long-running one; the others are newer, one second apart.
            clone(
                cur,
                Task,
                template.pk,
                {
                    "id": task_expr,
                    "name": f"CASE WHEN g = 1 THEN '{marker} big' ELSE '{marker} ' || g END",
                    "created_at": f"now() - interval '1 second' * ({READ_TASKS} - g + 1)",
                    "updated_at": "now()",
                    "event_seq": f"CASE WHEN g = 1 THEN {big} ELSE {per_small} END",
                    "current_attempt_id": attempt_expr,
                },
                f"generate_series(1, {READ_TASKS}) g",
            )
            clone(
                cur,
                Attempt,
                template.current_attempt_id,
                {"id": attempt_expr, "task_id": task_expr, "number": "1"},
                f"generate_series(1, {READ_TASKS}) g",
            )
            # Event n (from 0): the first `big` on task 1, then per_small per task.
            clone(
                cur,
                Event,
                event_id,
                {
                    "task_id": f"'{prefix}' || lpad(t::text, 8, '0')",
                    "seq": "s",
                    "type": "CASE WHEN s = 1 THEN 'task.created' ELSE 'operation.succeeded' END",
                    "at": "now() - interval '1 millisecond' * (n_total - n)",
                    "data": """jsonb_build_object('n', n, 'note', 'seeded by make bench')""",
                },
                # Only integers are formatted into this SQL.
                f"""(SELECT n, {total} AS n_total,
                       CASE WHEN n < {big} THEN 1 ELSE 2 + (n - {big}) / {per_small} END AS t,
                       CASE WHEN n < {big} THEN n + 1 ELSE mod(n - {big}, {per_small}) + 1 END AS s
                     FROM generate_series(0, {total - 1}) n) g""",  # noqa: S608
            )
        with connection.cursor() as cur:
            cur.execute("ANALYZE runtime_event")
            cur.execute("ANALYZE runtime_task")
            cur.execute("ANALYZE runtime_attempt")
        seeded = Task.objects.get(agent_id=agent.actor.agent_id, name=f"{marker} big")
        log(f"seeded in {time.perf_counter() - began:.0f} s")
    small = list(
        Task.objects.filter(agent_id=agent.actor.agent_id, name__startswith=f"{marker} ")
        .exclude(pk=seeded.pk)
        .values_list("pk", flat=True)[:200]
    )
    return {
        "events": total,
        "tasks": READ_TASKS,
        "big": seeded.pk,
        "big_events": big,
        "small": small,
        "per_small": per_small,
    }


def clone(cur: Any, model: Any, template_pk: Any, overrides: dict[str, str], source: str) -> None:
    """INSERT one row per ``source`` row, each a copy of the template row with ``overrides``
    (SQL expressions) for some columns; the table's own identity column is left to it."""
    table = model._meta.db_table
    columns = [f.column for f in model._meta.concrete_fields]
    pk = model._meta.pk
    if pk.column not in overrides and pk.get_internal_type() in ("AutoField", "BigAutoField"):
        columns.remove(pk.column)
    select = [overrides.get(c, f'tpl."{c}"') for c in columns]
    quoted = ", ".join(f'"{c}"' for c in columns)
    cur.execute(
        f'INSERT INTO "{table}" ({quoted}) SELECT {", ".join(select)} '  # noqa: S608 (our own SQL)
        f'FROM "{table}" tpl, {source} WHERE tpl."{pk.column}" = %s',
        [template_pk],
    )


def read_rounds(port: int, agent: Agent, seed: dict[str, Any]) -> dict[str, float]:
    """One client, one request at a time: the list's first pages (following `next`) and
    timelines (the long task at random cursors, short tasks from the start)."""
    c = Client(port, agent.secret)
    rng = random.Random(7)
    lists, timelines = [], []
    try:
        for _ in range(5):  # warm-up
            c.request("GET", "/api/v1/tasks")
        cursor = None
        for i in range(READ_REQUESTS):
            path = "/api/v1/tasks" + (f"?cursor={quote(cursor)}" if cursor else "")
            status, body, seconds = c.request("GET", path)
            if status != 200:
                raise SystemExit(f"bench: GET {path} answered {status} {body}")
            lists.append(seconds * 1000)
            cursor = body.get("next") if i % 5 != 4 else None  # five pages deep, then again
        for i in range(READ_REQUESTS):
            if i % 2 == 0:
                after = rng.randrange(0, seed["big_events"])
                path = f"/api/v1/tasks/{seed['big']}/events?after={after}"
            else:
                path = f"/api/v1/tasks/{rng.choice(seed['small'])}/events"
            status, body, seconds = c.request("GET", path)
            if status != 200 or not body.get("events"):
                raise SystemExit(f"bench: GET {path} answered {status} {str(body)[:300]}")
            timelines.append(seconds * 1000)
    finally:
        c.close()
    return {
        "list_p50_ms": median(lists),
        "list_p99_ms": percentile(lists, 0.99),
        "timeline_p50_ms": median(timelines),
        "timeline_p99_ms": percentile(timelines, 0.99),
    }


# --- the run ------------------------------------------------------------------------------------


def main() -> int:
    began = time.perf_counter()
    url = bench_database_url()
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
    if re.search(r"/(11|15)$", os.environ["REDIS_URL"]):
        raise SystemExit("bench: Redis dbs 11 and 15 belong to the test suites; use another")
    os.environ["CELERY_QUEUE"] = QUEUE
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    env = dict(os.environ)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True
    )

    import django

    django.setup()
    from django.db import connection

    log(f"workers={WORKERS} rounds={ROUNDS} ops={OPS} quick={QUICK}")
    agent = bench_agent("bench-path")
    flush_redis()
    counts = ours_counts(agent)
    log(f"in-process sample of {SAMPLE}: {counts['statements_per_op']:.1f} statements/op")

    chart: dict[str, dict[int, float]] = {"ours": {}, "celery": {}}
    worker = ours_workers(WORKERS, env, agent)
    try:
        # The three systems take turns, round by round, each with the same worker count, so
        # that a noisy minute on a shared host falls on all three alike: each round's ratios
        # compare measurements taken seconds apart, and the ratios reported are the medians
        # of the rounds' own ratios. A side waits idle while another runs (plain Celery's
        # pool and ours block on Redis; DBOS runs in a process started for its round).
        noop = celery_pool(WORKERS, env)
        try:
            bursts, celery, dbos_per_round = [], [], []
            for r in range(ROUNDS):
                bursts.append(ours_burst(agent, OPS, f"burst-{r}"))
                celery.append(celery_round(CELERY_TASKS))
                dbos_per_round.append(dbos_round())
                log(
                    f"round {r + 1}/{ROUNDS}: ours {bursts[-1]['ops_per_s']:.1f} ops/s, "
                    f"plain Celery {celery[-1]:.0f} tasks/s, DBOS {dbos_per_round[-1]:.0f} "
                    "workflows/s"
                )
        finally:
            stop(noop)
        peak = median([b["ops_per_s"] for b in bursts])
        dbos = {"rounds": dbos_per_round, "threads": DBOS_THREADS}
        ratios_celery = [b["ops_per_s"] / c for b, c in zip(bursts, celery, strict=True) if c]
        ratios_dbos = [b["ops_per_s"] / d for b, d in zip(bursts, dbos_per_round, strict=True) if d]
        paced = ours_paced(agent, max(1.0, peak / 2), "paced")
        log(f"ours paced at {paced['rate']:.1f}/s: p50 {paced['p50_ms']:.1f} ms")
    finally:
        stop(worker)
    chart["ours"][WORKERS] = peak
    for n in CHART_WORKERS:
        if n == WORKERS:
            continue
        worker = ours_workers(n, env, agent)
        try:
            chart["ours"][n] = ours_burst(agent, CHART_OPS, f"chart-{n}")["ops_per_s"]
            log(f"ours with {n} worker processes: {chart['ours'][n]:.1f} ops/s")
        finally:
            stop(worker)

    chart["celery"][WORKERS] = median(celery)
    log(f"plain Celery: {median(celery):.0f} tasks/s")
    for n in CHART_WORKERS:
        if n != WORKERS:
            chart["celery"][n] = celery_rounds(n, env, 1, max(CELERY_TASKS // 2, 1))[0]
            log(f"plain Celery with {n} worker processes: {chart['celery'][n]:.0f} tasks/s")
    log(f"DBOS: {median(dbos['rounds']):.0f} workflows/s ({dbos['threads']} threads)")

    # One agent per seed size: switching between quick and full runs reseeds nothing.
    reader = bench_agent(f"bench-reads-{READ_TASKS}x{READ_EVENTS}")
    seed = seed_reads(reader)
    connection.close()
    port = free_port()
    server = serve_app(port, env)
    try:
        probe = Client(port, agent.secret)

        def up() -> bool:
            try:
                return probe.request("GET", "/api/v1/tasks?limit=1")[0] == 200
            except OSError:
                return False

        wait_until(up, 60, "the ASGI server", every=0.2)
        probe.close()
        vacuum()
        api = api_rounds(port, agent)
        log(f"REST: {api['api_propose_per_s']:.1f} proposals/s, p99 {api['api_p99_ms']:.1f} ms")
        vacuum()
        reads = read_rounds(port, reader, seed)
        log(
            f"reads: list p99 {reads['list_p99_ms']:.1f} ms, timeline p99 "
            f"{reads['timeline_p99_ms']:.1f} ms"
        )
    finally:
        stop(server)

    ops = peak
    celery_ops, dbos_ops = median(celery), median(dbos["rounds"])
    result = {
        "ops_per_s": ops,
        "celery_ops_per_s": celery_ops,
        "dbos_ops_per_s": dbos_ops,
        "ratio_vs_celery": median(ratios_celery) if ratios_celery else 0.0,
        "ratio_vs_dbos": median(ratios_dbos) if ratios_dbos else 0.0,
        "p50_ms": paced["p50_ms"],
        "p99_ms": paced["p99_ms"],
        "commits_per_op": median([b["commits_per_op"] for b in bursts]),
        "statements_per_op": counts["statements_per_op"],
        "api_propose_per_s": api["api_propose_per_s"],
        "list_p99_ms": reads["list_p99_ms"],
        "timeline_p99_ms": reads["timeline_p99_ms"],
    }
    from bench_report import write_report

    path = write_report(
        OUT,
        result=result,
        details={
            "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "quick": QUICK,
            "workers": WORKERS,
            "rounds": ROUNDS,
            "ops": OPS,
            "proposers": PROPOSERS,
            "bursts": bursts,
            "paced": paced,
            "counts": counts,
            "celery": celery,
            "celery_tasks": CELERY_TASKS,
            "dbos": dbos,
            "ratios": {"celery": ratios_celery, "dbos": ratios_dbos},
            "api": api,
            "api_clients": API_CLIENTS,
            "reads": reads,
            "seed": {k: v for k, v in seed.items() if k != "small"},
            "chart": chart,
            "load": os.getloadavg(),
            "seconds": time.perf_counter() - began,
        },
    )
    log(f"report: {path} ({time.perf_counter() - began:.0f} s in all)")
    print("RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in result.items()), flush=True)
    return 0


def fmt(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
