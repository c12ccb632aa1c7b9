"""`make bench`: what users get, side by side with plain Celery and DBOS Transact, in one run, on
the same PostgreSQL server and Redis, with the same number of worker processes (docs/benchmark.md
says what each figure measures and how).

The headline is the one-operation path with a tool that has no ``quick_calls`` (``demo.slow``
with 0 seconds: a receiver call and nothing else), proposals posted over HTTP by agents in
separate processes (deploy/bench_agents.py, keep-alive connections) to a stack started as
`make run` starts it in services mode (``manage.py runstack``: web via console.server, a Celery
worker with WORKERS prefork children, beat with the sweeper), timed from the first scheduled
send to the commit of the last acceptance (its commit record in the WAL). Beside it, each its
own figure, never the headline: the paced latency at half the headline's rate, the REST floor
(deploy/bench_floor.py), realistic mixes (a budgeted task, an approval-gated operation, a 30 ms
tool, a held backlog), the batch path (in-process proposers, the quick ``demo.echo``, under a
backlog) and reads.

Counted across all backends: write commits and WAL bytes of the bench's databases (pg_walinspect:
the commit records of the transactions that touched them, so other databases on a shared server
do not count; the tool receiver's own commits apart), transactions (pg_stat_database), Redis
commands (INFO commandstats of a Redis server started for the bench), web and worker CPU
(/proc). Counted in-process over a sample: round trips per operation including BEGIN and
COMMIT, through the REST view and the worker's task body.

Rounds: BENCH_ROUNDS (at least 7 by default) rounds, each running ours, plain Celery, DBOS's four
configurations and the floor in a random order (seeded: BENCH_SEED); each ratio is the median of
the rounds' own ratios with a bootstrap 95% interval; every raw round is in var/bench/report.md.

It ends with one line:

    RESULT ops_per_s=.. ratio_vs_celery=.. ratio_vs_dbos=.. commits_per_op=.. p50_ms=.. ...

Each part's figures are written to var/bench/parts/<part>.json as the part ends; a part that
fails (an exception, a timeout) is logged, its file says why, and the run goes on: the report
and the RESULT line come out with the other parts' figures and end with ``missing=`` naming the
failed parts and the figures they would have given (exit status 1). WAL bytes come from
counters (pg_stat_wal, the WAL position moved), never from reading segments a busy server may
have recycled; the WAL scan that counts commits is skipped for a window whose segment is gone.

BENCH_QUICK=1 runs every part small, as a check of the harness only (its figures mean nothing).

Knobs: WORKERS (2), BENCH_ROUNDS (7), BENCH_OPS (1500 operations per round),
BENCH_AGENT_PROCS (WORKERS), BENCH_AGENT_CLIENTS (8 in all), BENCH_TASKS (20 per round),
BENCH_PACED_SECONDS (10), BENCH_SAMPLE (40), BENCH_CELERY_TASKS (3000), BENCH_DBOS_WORKFLOWS
(1500), BENCH_DBOS_THREADS (4 x WORKERS), BENCH_DBOS_POLL (0.01 s), BENCH_FLOOR_REQUESTS (1500),
BENCH_MIX_OPS (600), BENCH_MIX_ROUNDS (3), BENCH_BACKLOG (600), BENCH_BATCH_OPS (2000),
BENCH_READ_EVENTS (1000000), BENCH_READ_TASKS (10000), BENCH_READ_REQUESTS (200),
BENCH_SLOW_OPS (400), BENCH_SLOW_SECONDS (1), BENCH_SLOW_FULL_SECONDS (15), BENCH_HTTP_OPS (2000),
BENCH_HTTP_ROUNDS (3), BENCH_HTTP_DELAY_MS (50), BENCH_PARTS (all; slow: the stack and the slow
tools' part only; http: the stack and the HTTP tools' part only; peers: rounds of ours, the
floor and the peers over HTTP, drf_celery and dbos_http, only), BENCH_DBOS_DB
(agent_console_bench_dbos),
BENCH_TIMEOUT (300 s), BENCH_SEED (1), BENCH_PRIVATE_REDIS (1), BENCH_OUT (var/bench).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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


def knob(name: str, default: int, quick: int) -> int:
    return int(os.environ.get(name, quick if QUICK else default))


WORKERS = int(os.environ.get("WORKERS", "2"))
ROUNDS = knob("BENCH_ROUNDS", 7, 2)
OPS = knob("BENCH_OPS", 1500, 60)
AGENT_PROCS = knob("BENCH_AGENT_PROCS", WORKERS, WORKERS)
AGENT_CLIENTS = max(AGENT_PROCS, knob("BENCH_AGENT_CLIENTS", 8, 4))
TASKS_PER_ROUND = knob("BENCH_TASKS", 20, 5)
PACED_SECONDS = knob("BENCH_PACED_SECONDS", 10, 2)
SAMPLE = knob("BENCH_SAMPLE", 40, 10)
CELERY_TASKS = knob("BENCH_CELERY_TASKS", 3000, 300)
DBOS_WORKFLOWS = knob("BENCH_DBOS_WORKFLOWS", 1500, 100)
DBOS_THREADS = knob("BENCH_DBOS_THREADS", 4 * WORKERS, 4 * WORKERS)
DBOS_POLL = float(os.environ.get("BENCH_DBOS_POLL", "0.01"))
FLOOR_REQUESTS = knob("BENCH_FLOOR_REQUESTS", 1500, 80)
MIX_OPS = knob("BENCH_MIX_OPS", 600, 30)
MIX_ROUNDS = knob("BENCH_MIX_ROUNDS", 3, 1)
BACKLOG = knob("BENCH_BACKLOG", 600, 40)
BATCH_OPS = knob("BENCH_BATCH_OPS", 2000, 60)
SLOW_OPS = knob("BENCH_SLOW_OPS", 400, 60)
SLOW_SECONDS = float(os.environ.get("BENCH_SLOW_SECONDS", "1"))
SLOW_FULL_SECONDS = knob("BENCH_SLOW_FULL_SECONDS", 15, 8)
HTTP_OPS = knob("BENCH_HTTP_OPS", 2000, 60)
HTTP_ROUNDS = knob("BENCH_HTTP_ROUNDS", 3, 1)
# "slow", "http": only the stack and that part (its own RESULT line), for a quick look.
PARTS = os.environ.get("BENCH_PARTS", "all")
READ_EVENTS = knob("BENCH_READ_EVENTS", 1_000_000, 20_000)
READ_TASKS = knob("BENCH_READ_TASKS", 10_000, 200)
READ_REQUESTS = knob("BENCH_READ_REQUESTS", 200, 30)
TIMEOUT = knob("BENCH_TIMEOUT", 300, 120)
SEED = knob("BENCH_SEED", 1, 1)
PRIVATE_REDIS = knob("BENCH_PRIVATE_REDIS", 1, 1)
OUT = Path(os.environ.get("BENCH_OUT", str(ROOT / "var" / "bench")))

# The headline's tool: no quick_calls, so every operation takes the one-operation path; its
# receiver records the call (two autocommit writes, counted apart as the receiver's).
HEADLINE_TOOL, HEADLINE_PARAMS = "demo.slow", {"seconds": 0}
# A run on its own database (a helper beside `make bench`) names its own DBOS database.
DBOS_DB = os.environ.get("BENCH_DBOS_DB", "agent_console_bench_dbos")
DBOS_CONFIGS = ("direct-1", f"direct-{WORKERS}", "queue-1", f"queue-{WORKERS}")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bootstrap(values: list[float], n: int = 4000) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median (seeded: the same rounds give the same
    interval). With one round there is nothing to resample: the interval is the value."""
    if not values:
        return (0.0, 0.0)
    rng = random.Random(SEED)
    medians = sorted(median(rng.choices(values, k=len(values))) for _ in range(n))
    return (medians[int(n * 0.025)], medians[min(n - 1, int(n * 0.975))])


# --- services -----------------------------------------------------------------------------------


def bench_database_url() -> str:
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agent_console_bench")
    name = urlparse(url).path.lstrip("/")
    if "bench" not in name:
        # The bench writes a million rows and flushes its Redis db: never someone else's.
        raise SystemExit(f"refusing to benchmark on database {name!r}: its name must say bench")
    return url


def ensure_database(url: str, name: str | None = None) -> None:
    import psycopg

    parsed = urlparse(url)
    name = name or parsed.path.lstrip("/")
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(process: subprocess.Popen[Any]) -> None:
    """Stop a process this script started (and only that one)."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def process_log() -> Any:
    OUT.mkdir(parents=True, exist_ok=True)
    return (OUT / "processes.log").open("ab")


def wait_until(check: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def private_redis(shared_url: str) -> tuple[subprocess.Popen[bytes] | None, str, str]:
    """A Redis server for the bench alone, configured for persistence as the shared one is, so
    that INFO commandstats (server-wide) counts the bench's commands and nobody else's. Without
    redis-server on the PATH, the shared one and a note that its counts include others'."""
    import redis

    binary = shutil.which("redis-server")
    if not PRIVATE_REDIS or binary is None:
        why = "BENCH_PRIVATE_REDIS=0" if binary else "no redis-server on the PATH"
        return None, shared_url, f"shared Redis ({why}): its command counts include other clients'"
    shared = redis.Redis.from_url(shared_url)
    conf = {k: shared.config_get(k).get(k, "") for k in ("appendonly", "appendfsync", "save")}
    port = free_port()
    data = OUT / "redis"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    process = subprocess.Popen(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)),
            *("--appendonly", conf["appendonly"] or "no", "--save", conf["save"] or ""),
            *("--appendfsync", conf["appendfsync"] or "everysec", "--daemonize", "no"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=process_log(),
    )
    url = f"redis://127.0.0.1:{port}/3"

    def up() -> bool:
        try:
            return bool(redis.Redis.from_url(url).ping())
        except redis.ConnectionError:
            return False

    wait_until(up, 20, "the bench's Redis server")
    note = (
        f"a Redis server started for the bench (port {port}; appendonly {conf['appendonly']}, "
        f"appendfsync {conf['appendfsync']}, save '{conf['save']}', as the shared one)"
    )
    return process, url, note


def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


def flush_redis() -> None:
    redis_client().flushdb()


def redis_calls() -> int:
    """Commands the Redis server has run, less the INFO calls that read this."""
    stats = redis_client().info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


# --- processes: CPU from /proc ------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree[ppid].append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes (their reaped children's too)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy, on all cores (/proc/stat: user, nice, system,
    irq, softirq; not idle, iowait or steal, the time another guest of the host had): what every
    process of a part (the stack, the agents, PostgreSQL, Redis, a peer's processes) cost."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / TICK


# --- counting across all backends ---------------------------------------------------------------

_REL = re.compile(r"rel \d+/(\d+)/(\d+)")
_COMMIT_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?[+-]\d\d(?::?\d\d)?)")
_SUBXACTS = re.compile(r"subxacts:((?: \d+)+)")


def db_oid(name: str) -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT oid FROM pg_database WHERE datname = %s", [name])
        row = cur.fetchone()
    return int(row[0]) if row else -1


def receiver_filenodes() -> set[int]:
    """The storage of the demo tools' receivers (tables, indexes, TOAST): they stand for a
    remote service, so their commits are counted apart from the path's."""
    from django.db import connection

    from runtime.sandbox import models as sandbox

    tables = [
        m._meta.db_table
        for m in vars(sandbox).values()
        if hasattr(m, "_meta") and m.__module__ == sandbox.__name__
    ]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_relation_filenode(c.oid) FROM pg_class c WHERE c.oid IN ("
            " SELECT t.oid FROM pg_class t WHERE t.relname = ANY(%s)"
            " UNION SELECT i.indexrelid FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid"
            "  WHERE t.relname = ANY(%s)"
            " UNION SELECT t.reltoastrelid FROM pg_class t WHERE t.relname = ANY(%s))",
            [tables, tables, tables],
        )
        return {int(r[0]) for r in cur.fetchall() if r[0]}


@dataclass
class WalScan:
    """What the WAL says about a window, for the databases asked about."""

    commits: dict[str, int]  # database name -> write commits
    receiver_commits: int  # of the bench database's: transactions only the receivers wrote in
    wal_bytes: dict[str, int]  # database name -> bytes of the records that touched it
    commit_at: dict[int, float]  # xid (and its subtransactions') -> commit time, epoch seconds
    total_bytes: int  # every record of the window, all databases
    # database name -> bytes of full-page images among wal_bytes: written for a page's first
    # change after a checkpoint, so they follow where the checkpoints fell (issue 37)
    fpi_bytes: dict[str, int] = field(default_factory=dict)


class Window:
    """Counters read at the start of a measured window and again at its end: the WAL (write
    commits of the bench's databases, WAL bytes, commit times), pg_stat_database (transactions
    of any kind, all backends), Redis commands (server-wide), CPU of the stack's processes."""

    def __init__(self, bench: Bench, stack: Stack | None = None) -> None:
        self.bench, self.stack = bench, stack
        self.lsn = bench.flush_lsn()
        self.wal = bench.wal_counters()
        self.xacts = bench.xacts()
        self.redis = redis_calls()
        self.cpu = stack.cpu() if stack else {}
        self.machine = machine_busy()
        self.machine_end: float | None = None
        self.began = time.time()

    def mark(self) -> None:
        """The part's work ended: the machine's CPU is read now, before its processes are
        stopped or the WAL is scanned (close reads it first thing otherwise)."""
        self.machine_end = machine_busy()

    def close(self, ops: int) -> dict[str, Any]:
        machine = self.machine_end if self.machine_end is not None else machine_busy()
        bench, n = self.bench, max(1, ops)
        end = bench.flush_lsn()
        wal = {k: v - self.wal.get(k, 0) for k, v in bench.wal_counters(self.lsn, end).items()}
        scan = bench.scan(self.lsn, end)
        xacts = {k: v - self.xacts.get(k, 0) for k, v in bench.xacts().items()}
        cpu = {
            k: v - self.cpu.get(k, 0.0) for k, v in (self.stack.cpu() if self.stack else {}).items()
        }
        self.scan = scan
        return {
            "commits_per_op": scan.commits.get("bench", 0) / n - scan.receiver_commits / n,
            "receiver_commits_per_op": scan.receiver_commits / n,
            "dbos_commits_per_op": scan.commits.get("dbos", 0) / n,
            "wal_bytes_per_op": scan.wal_bytes.get("bench", 0) / n,
            "wal_fpi_bytes_per_op": scan.fpi_bytes.get("bench", 0) / n,
            "dbos_wal_bytes_per_op": scan.wal_bytes.get("dbos", 0) / n,
            "server_wal_bytes": scan.total_bytes,
            # Counters, no segment read (issue 37): the server's WAL position moved and
            # pg_stat_wal's bytes, records and full-page images over the window, all databases.
            "server_wal_lsn_bytes_per_op": wal.get("lsn_bytes", 0) / n,
            "server_wal_stat_bytes_per_op": wal.get("wal_bytes", 0) / n,
            "server_wal_records_per_op": wal.get("wal_records", 0) / n,
            "server_wal_fpi_per_op": wal.get("wal_fpi", 0) / n,
            "wal_scanned": bool(scan.total_bytes),
            "wal_window": f"{self.lsn} {end}",  # for a breakdown by relation afterwards
            "xacts_per_op": xacts.get("bench", 0) / n,
            "dbos_xacts_per_op": xacts.get("dbos", 0) / n,
            "redis_cmds_per_op": (redis_calls() - self.redis) / n,
            "cpu_ms_per_op": {k: v * 1000 / n for k, v in cpu.items()},
            "machine_cpu_ms_per_op": (machine - self.machine) * 1000 / n,
        }


def pg_xacts() -> dict[str, int]:
    """Transactions (committed or rolled back, read-only ones too) of the bench's databases, all
    backends, from pg_stat_database. Backends report their counts when idle, at most once a
    second (this one when told to): read after they settled, so a window gets its own."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT datname, xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = ANY(%s)",
            [[connection.settings_dict["NAME"], DBOS_DB]],
        )
        rows = dict(cur.fetchall())
    return {
        "bench": int(rows.get(connection.settings_dict["NAME"], 0)),
        "dbos": int(rows.get(DBOS_DB, 0)),
    }


class Bench:
    """The bench database's own view of the server: its oid, the DBOS database's, the WAL."""

    def __init__(self) -> None:
        from django.db import connection

        with connection.cursor() as cur:
            try:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                self.walinspect = True
            except Exception as exc:  # an older server or no rights: counts by xids instead
                self.walinspect, self.walinspect_error = False, str(exc).splitlines()[0]
        self.oids = {"bench": db_oid(connection.settings_dict["NAME"]), "dbos": db_oid(DBOS_DB)}
        self.receivers = receiver_filenodes()
        self.statements_note = pg_stat_statements_note()

    def flush_lsn(self) -> str:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT pg_current_wal_flush_lsn()::text")
            return str(cur.fetchone()[0])

    def xacts(self) -> dict[str, int]:
        return pg_xacts()

    def wal_counters(self, start: str | None = None, end: str | None = None) -> dict[str, int]:
        """pg_stat_wal's counters (bytes, records, full-page images; PostgreSQL 14 and later)
        and, given a window, the bytes between its two positions: no WAL segment is read, so a
        busy server recycling segments cannot take them away (issue 37). Server-wide."""
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT wal_bytes::bigint, wal_records, wal_fpi FROM pg_stat_wal")
            row = cur.fetchone()
            got = {"wal_bytes": int(row[0]), "wal_records": int(row[1]), "wal_fpi": int(row[2])}
            if start is not None and end is not None:
                cur.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", [end, start])
                got["lsn_bytes"] = int(cur.fetchone()[0])
        return got

    def segment_kept(self, lsn: str) -> bool:
        """Whether the WAL segment holding ``lsn`` is still on disk (not yet recycled)."""
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_ls_waldir() WHERE name = pg_walfile_name(%s))",
                [lsn],
            )
            return bool(cur.fetchone()[0])

    def scan(self, start: str, end: str) -> WalScan:
        from django.db import OperationalError, connection

        empty = WalScan({}, 0, {}, {}, 0)
        if not self.walinspect:
            return empty
        try:
            kept = self.segment_kept(start)
        except Exception as exc:  # pg_ls_waldir needs pg_monitor: try the scan as before
            log(f"cannot list the WAL directory ({str(exc).splitlines()[0]})")
            kept = True
        if not kept:
            # Recycled by a busy server: the window's WAL bytes come from the counters alone
            # (Window.close), commits and commit times are not counted for it.
            log(f"the window's first WAL segment ({start}) was recycled: no WAL scan for it")
            return empty
        # pg_stat_database's counters reach the view once a backend reports them (at most a
        # second later, at the end of a transaction): the WAL is exact, read it in one go.
        try:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT xid::text::bigint, resource_manager, record_type, record_length, "
                    "description, block_ref, fpi_length "
                    "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)",
                    [start, end],
                )
                rows = cur.fetchall()
        except OperationalError as exc:
            # A shared server busy with other work recycled the window's WAL before it was read:
            # no WAL counts for this window, and commit times fall back to the journal's (the
            # report counts those as approximated).
            log(f"the window's WAL is gone ({str(exc).splitlines()[0]}): no WAL counts for it")
            return empty
        by_name = {oid: name for name, oid in self.oids.items()}
        touched: dict[int, set[str]] = defaultdict(set)  # xid -> databases it wrote in
        ours: set[int] = set()  # xids that wrote bench relations other than the receivers'
        wal_bytes: Counter[str] = Counter()
        fpi_bytes: Counter[str] = Counter()
        commits: list[tuple[int, list[int], float]] = []
        total = 0
        for xid, rmgr, rtype, length, desc, refs, fpi in rows:
            total += length
            if rmgr == "Transaction" and rtype.startswith("COMMIT"):
                sub = _SUBXACTS.search(desc or "")
                subs = [int(s) for s in sub.group(1).split()] if sub else []
                stamp = _COMMIT_TS.match(desc or "")
                at = datetime.fromisoformat(stamp.group(1)).timestamp() if stamp else 0.0
                commits.append((xid, subs, at))
                continue
            for db, node in _REL.findall(refs or ""):
                name = by_name.get(int(db))
                if name is None:
                    continue
                touched[xid].add(name)
                wal_bytes[name] += length
                fpi_bytes[name] += fpi or 0
                if name == "bench" and int(node) not in self.receivers:
                    ours.add(xid)
        counted: Counter[str] = Counter()
        receiver_only = 0
        commit_at: dict[int, float] = {}
        for xid, subs, at in commits:
            group = [xid, *subs]
            names = set().union(*(touched.get(x, set()) for x in group))
            for name in names:
                counted[name] += 1
            if "bench" in names and not any(x in ours for x in group):
                receiver_only += 1
            for x in group:
                commit_at[x] = at
        return WalScan(
            dict(counted), receiver_only, dict(wal_bytes), commit_at, total, dict(fpi_bytes)
        )


def pg_stat_statements_note() -> str:
    """pg_stat_statements would count every statement of every backend; it needs the library
    preloaded (a server restart), which the bench does not do to a shared server."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW shared_preload_libraries")
        loaded = "pg_stat_statements" in str(cur.fetchone()[0])
    if loaded:
        return "pg_stat_statements is loaded (see statements in the in-process counts)"
    return (
        "pg_stat_statements not measured: the server does not preload it "
        "(shared_preload_libraries; loading it takes a restart, not done to a shared server)"
    )


# --- in-process counts: round trips -------------------------------------------------------------

_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b|\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b", re.I)


@dataclass
class SqlCount:
    """Every round trip one connection makes: each statement, the BEGIN psycopg sends before a
    transaction's first statement, and each COMMIT or ROLLBACK of an open transaction; and the
    commits that wrote (a transaction that inserted, updated, deleted or locked rows)."""

    statements: int = 0
    begins: int = 0
    ends: int = 0
    write_commits: int = 0
    receiver_commits: int = 0  # of those, the demo receiver's own (its tables, autocommit)
    verbs: Counter[str] = field(default_factory=Counter)
    _open: bool = False
    _wrote: bool = False

    @property
    def round_trips(self) -> int:
        return self.statements + self.begins + self.ends

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
        self.statements += 1
        self.verbs[verb] += 1
        in_txn = not context["connection"].get_autocommit()
        if in_txn and not self._open:
            self._open = True
            self.begins += 1
        if _WRITE.search(sql) and verb not in ("SAVEPOINT", "RELEASE"):
            if in_txn:
                self._wrote = True
            else:
                self.write_commits += 1  # autocommit: the statement is its own transaction
                if '"sandbox_' in sql:
                    self.receiver_commits += 1
        return execute(sql, params, many, context)

    def ended(self, committed: bool) -> None:
        if self._open:
            self.ends += 1
            if committed and self._wrote:
                self.write_commits += 1
        self._open = self._wrote = False


@contextmanager
def counting(connection: Any) -> Iterator[SqlCount]:
    count = SqlCount()
    commit, rollback = connection.commit, connection.rollback
    inner_commit, inner_rollback = connection._commit, connection._rollback

    def counted_commit() -> None:
        inner_commit()
        count.ended(True)

    def counted_rollback() -> None:
        inner_rollback()
        count.ended(False)

    # Django's atomic blocks end through _commit/_rollback; commit()/rollback() call them too.
    connection._commit, connection._rollback = counted_commit, counted_rollback
    try:
        with connection.execute_wrapper(count):
            yield count
    finally:
        del connection._commit, connection._rollback
        assert connection.commit == commit and connection.rollback == rollback


# --- the stack, as `make run` starts it ---------------------------------------------------------


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


def bench_approver() -> str:
    """A console operator and a script token acting as them: the approval mix's approver."""
    from runtime.accounts import console_user_create
    from runtime.tokens import token_issue_for_user

    console_user_create("bench-approver", "operator", uuid.uuid4().hex)
    return token_issue_for_user("bench-approver").secret


class Stack:
    """``manage.py runstack`` (what `make run` starts after migrating): web, worker, beat under
    the supervisor, with the bench's environment (services mode: DATABASE_URL, REDIS_URL)."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.port = port
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=process_log(),
            stderr=process_log(),
        )

    def ready(self, agent: Agent) -> None:
        probe = Client(self.port, agent.secret)

        def healthy() -> bool:
            if self.process.poll() is not None:
                raise SystemExit("bench: the stack exited; see var/bench/processes.log")
            try:
                status, body, _ = probe.request("GET", "/healthz")
            except OSError:
                return False
            return status == 200 and int(body.get("workers") or 0) >= 1

        wait_until(healthy, 120, "the stack (/healthz with workers)", every=0.2)
        task = new_tasks(agent, 1, "warm")[0]
        for i in range(3):  # each worker child's first operation imports and connects
            status, body, _ = probe.request(
                "POST",
                f"/api/v1/tasks/{task}/operations",
                {"tool": HEADLINE_TOOL, "step": f"warm-{i}", "params": HEADLINE_PARAMS},
            )
            if status != 201:
                raise SystemExit(f"bench: a warm-up proposal answered {status} {body}")
        probe.close()
        wait_drained([task], 3)

    def pids(self, marker: str) -> list[int]:
        return [p for p in descendants(self.process.pid) if marker in cmdline(p)]

    def cpu(self) -> dict[str, float]:
        return {
            "web": cpu_seconds(self.pids("console.server")),
            "worker": cpu_seconds(self.pids("celery")),
            "beat": cpu_seconds(self.pids("manage.py beat")),
        }

    def signal_workers(self, signum: int) -> None:
        for pid in self.pids("celery"):
            with suppress(ProcessLookupError):
                os.kill(pid, signum)

    def stop(self) -> None:
        stop(self.process)


# --- ours ---------------------------------------------------------------------------------------


def new_tasks(
    agent: Agent, count: int, label: str, budget: dict[str, Any] | None = None
) -> list[str]:
    from runtime.tasks import TaskSpec, task_create

    return [
        task_create(agent.actor, TaskSpec(name=f"bench {label} {i}", budget=budget)).pk
        for i in range(count)
    ]


def propose(agent: Agent, task_id: str, step: str, tool: str, params: dict[str, Any]) -> str:
    from runtime.specs import OperationSpec
    from runtime.transitions.propose import operation_propose

    op, _ = operation_propose(
        agent.actor, task_id, OperationSpec(tool=tool, step=step, params=params)
    )
    return str(op.pk)


def succeeded_count(task_ids: list[str]) -> int:
    from runtime.models import Operation

    return Operation.objects.filter(task_id__in=task_ids, status="succeeded").count()


def wait_drained(task_ids: list[str], total: int) -> None:
    """Until the round's ``total`` operations succeeded. It polls the round's task rows, whose
    maintained counter of active operations is a primary-key read of a few rows, and counts the
    operations once at the end (counting them every poll cost PostgreSQL 3 ms a poll)."""
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


_HOT_TABLES = (
    "runtime_operation, runtime_task, runtime_taskcount, runtime_outboxmessage, "
    "runtime_invocation, runtime_event, runtime_rejectedobservation"
)


def vacuum() -> None:
    """VACUUM ANALYZE the hot tables before a measured part, as autovacuum would have between
    the bench's parts on a server that runs it (this machine's PostgreSQL may have it off):
    each part starts from the same state instead of from the dead rows of the last."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"VACUUM (ANALYZE) {_HOT_TABLES}")


def acceptance_times(op_ids: list[str], scan: WalScan | None) -> tuple[dict[str, float], int]:
    """Each operation's acceptance commit time: the commit record (in the WAL) of the
    transaction that wrote its ``operation.succeeded`` event (the row's xmin). Where the WAL has
    no record (pg_walinspect missing), the event's ``at``, which is earlier than the commit: the
    count of those is returned so the report can say so."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT operation_id, xmin::text::bigint, at FROM runtime_event "
            "WHERE operation_id = ANY(%s) AND type = 'operation.succeeded'",
            [op_ids],
        )
        rows = cur.fetchall()
    found, approximated = {}, 0
    for op_id, xmin, at in rows:
        committed = scan.commit_at.get(int(xmin)) if scan else None
        if committed:
            found[op_id] = committed
        else:
            found[op_id] = at.timestamp()
            approximated += 1
    return found, approximated


class Agents:
    """BENCH_AGENT_PROCS agent processes (deploy/bench_agents.py) with BENCH_AGENT_CLIENTS
    keep-alive clients between them, connected and waiting for the start."""

    def __init__(self, port: int, secret: str, plan: dict[str, Any]) -> None:
        self.processes = []
        per = [
            AGENT_CLIENTS // AGENT_PROCS + (1 if k < AGENT_CLIENTS % AGENT_PROCS else 0)
            for k in range(AGENT_PROCS)
        ]
        first = 0
        for clients in per:
            p = subprocess.Popen(
                [sys.executable, str(DEPLOY / "bench_agents.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=process_log(),
                text=True,
            )
            line = {
                **plan,
                "port": port,
                "secret": secret,
                "first_client": first,
                "clients": clients,
                "total": AGENT_CLIENTS,
            }
            assert p.stdin is not None
            p.stdin.write(json.dumps(line) + "\n")
            p.stdin.flush()
            first += clients
            self.processes.append(p)
        for p in self.processes:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("bench: an agent process did not start; see processes.log")

    def start(self) -> float:
        start = time.time() + 0.05
        for p in self.processes:
            assert p.stdin is not None
            p.stdin.write(f"{start!r}\n")
            p.stdin.close()
        return start

    def results(self) -> tuple[list[list[Any]], list[str]]:
        ops, errors = [], []
        for p in self.processes:
            assert p.stdout is not None
            out = p.stdout.read()
            p.wait()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if not lines:
                raise SystemExit("bench: an agent process printed nothing; see processes.log")
            data = json.loads(lines[-1])
            ops.extend(data["ops"])
            errors.extend(data["errors"])
        return ops, errors


def ours_http(
    bench: Bench,
    stack: Stack,
    agent: Agent,
    label: str,
    count: int,
    *,
    rate: float = 0.0,
    tool: str = HEADLINE_TOOL,
    params: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
    approver: Callable[[list[str]], None] | None = None,
    hold: bool = False,
) -> dict[str, Any]:
    """``count`` proposals posted over HTTP by the agent processes to the running stack (a burst,
    or paced at ``rate`` a second), until every operation is accepted. Throughput runs from the
    first scheduled send to the last acceptance's commit; latency from each operation's
    scheduled send to its acceptance's commit. With ``hold`` the workers are stopped (SIGSTOP)
    while the agents post and the clock runs from their release: the drain of a held backlog."""
    vacuum()
    task_ids = new_tasks(agent, TASKS_PER_ROUND, label, budget)
    agents = Agents(
        stack.port,
        agent.secret,
        {
            "tasks": task_ids,
            "count": count,
            "rate": rate,
            "tool": tool,
            "params": params if params is not None else HEADLINE_PARAMS,
            "label": label,
        },
    )
    if hold:
        stack.signal_workers(signal.SIGSTOP)
    window = Window(bench, stack)
    try:
        start = agents.start()
        ops, errors = agents.results()
    finally:
        if hold:
            released = time.time()
            stack.signal_workers(signal.SIGCONT)
    if errors:
        raise SystemExit(f"bench: {len(errors)} proposals over HTTP failed, e.g. {errors[0]}")
    op_ids = [o[0] for o in ops]
    if approver is not None:
        approver(op_ids)
    wait_drained(task_ids, count)
    counts = window.close(count)
    accepted, approximated = acceptance_times(op_ids, window.scan)
    last = max(accepted.values())
    begin = released if hold else start
    answered = max(o[3] for o in ops)
    latencies = [(accepted[o[0]] - o[1]) * 1000 for o in ops if o[0] in accepted]
    return {
        "label": label,
        "ops": count,
        "rate": rate,
        "ops_per_s": count / max(1e-9, last - begin),
        "seconds": last - begin,
        "propose_per_s": count / max(1e-9, answered - start),
        "p50_ms": median(latencies),
        "p99_ms": percentile(latencies, 0.99),
        "send_lag_p99_ms": percentile([(o[2] - o[1]) * 1000 for o in ops], 0.99),
        "approximated_commit_times": approximated,
        "achieved_rate": count / max(1e-9, max(o[2] for o in ops) - start) if rate else 0.0,
        **counts,
        "web_cpu_ms_per_proposal": counts["cpu_ms_per_op"].get("web", 0.0),
        "worker_cpu_ms_per_op": counts["cpu_ms_per_op"].get("worker", 0.0),
    }


def approve_all(port: int, secret: str) -> Callable[[list[str]], None]:
    """The approval mix's approver: a script acting as a console operator, listing what waits
    for it and deciding in bulk (POST /api/v1/approvals/decisions, up to 100 at a time), as a
    person's tooling would, until every operation of the round was approved."""

    def approve(op_ids: list[str]) -> None:
        wanted, done = set(op_ids), set[str]()
        c = Client(port, secret)
        deadline = time.monotonic() + TIMEOUT
        try:
            while done < wanted:
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench: {len(wanted - done)} approvals never appeared")
                status, body, _ = c.request("GET", "/api/v1/approvals?status=pending&limit=100")
                if status != 200:
                    raise SystemExit(f"bench: listing approvals answered {status} {body}")
                items = [a for a in body["results"] if a["operation"] in wanted]
                if not items:
                    time.sleep(0.05)
                    continue
                decisions = [
                    {
                        "approval": a["id"],
                        "decision": "approve",
                        "reason": "bench",
                        "params_hash": a["params_hash"],
                    }
                    for a in items
                ]
                status, body, _ = c.request(
                    "POST", "/api/v1/approvals/decisions", {"decisions": decisions}
                )
                if status != 200:
                    raise SystemExit(f"bench: deciding approvals answered {status} {body}")
                done.update(a["operation"] for a in items)
        finally:
            c.close()

    return approve


def batch_burst(bench: Bench, stack: Stack, agent: Agent, total: int, label: str) -> dict[str, Any]:
    """The batch path: ``total`` quick ``demo.echo`` operations proposed in this process (no
    HTTP) from as many threads as there are agent clients, as fast as they go, so a backlog
    forms and the workers claim and accept them in batches. Not what a real tool gets."""
    from django.db import connection

    vacuum()
    task_ids = new_tasks(agent, TASKS_PER_ROUND, label)
    threads_n = AGENT_CLIENTS
    barrier = threading.Barrier(threads_n + 1)

    def proposer(k: int) -> None:
        try:
            barrier.wait()
            for i in range(k, total, threads_n):
                propose(agent, task_ids[i % len(task_ids)], f"{label}-{i}", "demo.echo", {"i": i})
        finally:
            connection.close()

    threads = [threading.Thread(target=proposer, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    window = Window(bench, stack)
    barrier.wait()
    started = time.time()
    for t in threads:
        t.join()
    wait_drained(task_ids, total)
    counts = window.close(total)
    from runtime.models import Operation

    op_ids = [
        str(pk)
        for pk in Operation.objects.filter(task_id__in=task_ids).values_list("pk", flat=True)
    ]
    accepted, _ = acceptance_times(op_ids, window.scan)
    last = max(accepted.values())
    return {"ops_per_s": total / max(1e-9, last - started), "ops": total, **counts}


def slow_tools(bench: Bench, stack: Stack, agent: Agent, label: str) -> dict[str, Any]:
    """Slow tools side by side (issue 36, runtime.slots): BENCH_SLOW_OPS calls of
    ``demo.slow_wait`` waiting BENCH_SLOW_SECONDS each, posted over HTTP as the headline's;
    ops/s from the first send to the last acceptance's commit; calls in flight on average: the
    time the calls held their leases (each invocation's claim to its report) over that window,
    and the peak. Then ``slots_full``: each worker process's memory with its slots full."""
    from django.utils import timezone

    from runtime.models import Execution, Invocation

    before = {pid: _memory(pid) for pid in stack.pids("celery")}
    began = timezone.now()
    got = ours_http(
        bench,
        stack,
        agent,
        label,
        SLOW_OPS,
        tool="demo.slow_wait",
        params={"seconds": SLOW_SECONDS},
    )
    held = list(
        Invocation.objects.filter(
            operation__task__name__startswith=f"bench {label} ", started_at__gte=began
        ).values_list("started_at", "finished_at", "execution_id")
    )
    spans = [(s.timestamp(), f.timestamp()) for s, f, _ in held if f is not None]
    points = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    per_process = Counter(Execution.objects.get(pk=e).pid for _, _, e in held)
    return {
        **got,
        "in_flight_avg": sum(f - s for s, f in spans) / max(1e-9, got["seconds"]),
        "in_flight_peak": peak,
        "calls_per_process": sorted(per_process.values()),
        "slots_full": {**slots_full(agent, f"{label}-full"), "before": before},
    }


def _memory(pid: int) -> dict[str, float]:
    """A process's resident memory now and at its peak (MB), and its threads."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    status = dict(line.split(":", 1) for line in lines if ":" in line)
    return {
        "threads": int(status["Threads"]),
        "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "peak_rss_mb": int(status["VmHWM"].split()[0]) / 1024,
    }


def slots_full(agent: Agent, label: str) -> dict[str, Any]:
    """Each worker process's resident memory with its slots full: WORKERS x TOOL_SLOTS calls
    of ``demo.slow_wait`` proposed at once, each waiting BENCH_SLOW_FULL_SECONDS; read from
    /proc once every call started at its receiver, before any ends, for each process holding
    calls, beside its count of calls and threads."""
    from django.conf import settings

    from runtime.models import Execution, Operation
    from runtime.sandbox.models import SlowCall

    count = WORKERS * int(settings.TOOL_SLOTS)
    task_id = new_tasks(agent, 1, label)[0]
    threads_n = AGENT_CLIENTS

    def proposer(k: int) -> None:
        from django.db import connection

        try:
            for i in range(k, count, threads_n):
                propose(
                    agent,
                    task_id,
                    f"{label}-{i}",
                    "demo.slow_wait",
                    {"seconds": SLOW_FULL_SECONDS},
                )
        finally:
            connection.close()

    threads = [threading.Thread(target=proposer, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_until(
        lambda: SlowCall.objects.filter(key__contains=task_id).count() >= count,
        SLOW_FULL_SECONDS,
        f"{count} slow calls to start together",
        every=0.2,
    )
    holding = Counter(
        Operation.objects.filter(task_id=task_id, status="running").values_list(
            "execution_id", flat=True
        )
    )
    processes = []
    for execution_id, calls in sorted(holding.items(), key=lambda kv: -kv[1]):
        pid = Execution.objects.get(pk=execution_id).pid or 0
        processes.append({"pid": pid, "calls": calls, **_memory(pid)})
    wait_drained([task_id], count)
    return {"slots": int(settings.TOOL_SLOTS), "calls": count, "processes": processes}


def ours_counts(agent: Agent) -> dict[str, Any]:
    """Round trips per operation, counted in this process over SAMPLE operations with no worker
    running: the proposal through the REST view (Django's handler with the console's
    middleware, called in-process by django.test.Client, so the bytes do not cross a socket),
    then the worker's task body (claim -> invoke -> report). pg_stat_database's transactions and
    the Redis commands of the same window, all backends, are the server's side of it."""
    from django.db import connection
    from django.test import Client as DjangoClient

    from runtime.worker import execute_operation

    flush_redis()
    task_id = new_tasks(agent, 1, "counts")[0]
    http = DjangoClient(HTTP_AUTHORIZATION=f"Bearer {agent.secret}", HTTP_HOST="127.0.0.1")

    def post(step: str) -> str:
        response = http.post(
            f"/api/v1/tasks/{task_id}/operations",
            {"tool": HEADLINE_TOOL, "step": step, "params": HEADLINE_PARAMS},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=step,
        )
        if response.status_code != 201:
            raise SystemExit(
                f"bench: the sampled proposal answered {response.status_code} "
                f"{response.content[:300]!r}"
            )
        return str(response.json()["id"])

    # Registers this execution and warms the caches.
    execute_operation(post(f"counts-warm-{uuid.uuid4().hex[:8]}"))
    phases = {"propose (REST)": SqlCount(), "execute (worker)": SqlCount()}
    verbs: Counter[str] = Counter()
    xacts0, redis0 = pg_xacts(), redis_calls()
    for i in range(SAMPLE):
        step = f"counts-{i}-{uuid.uuid4().hex[:6]}"
        for phase, run in (("propose (REST)", lambda s=step: post(s)), ("execute (worker)", None)):
            with counting(connection) as c:
                if run is not None:
                    op_id = run()
                else:
                    outcome = execute_operation(op_id)
                    if outcome != "succeeded":
                        raise SystemExit(f"bench: the sampled operation ended {outcome!r}")
            p = phases[phase]
            p.statements += c.statements
            p.begins += c.begins
            p.ends += c.ends
            p.write_commits += c.write_commits
            p.receiver_commits += c.receiver_commits
            verbs.update(c.verbs)
    xacts = pg_xacts()["bench"] - xacts0["bench"]
    redis_n = redis_calls() - redis0
    flush_redis()  # the proposals' messages: nobody consumed them
    n = SAMPLE
    return {
        "sample": n,
        "tool": HEADLINE_TOOL,
        "round_trips_per_op": sum(p.round_trips for p in phases.values()) / n,
        "statements_per_op": sum(p.statements for p in phases.values()) / n,
        "commits_per_op": sum(p.write_commits - p.receiver_commits for p in phases.values()) / n,
        "receiver_commits_per_op": sum(p.receiver_commits for p in phases.values()) / n,
        "phases": {
            name: {
                "round_trips": p.round_trips / n,
                "statements": p.statements / n,
                "begins": p.begins / n,
                "commits_and_rollbacks": p.ends / n,
                "write_commits": p.write_commits / n,
                "receiver_commits": p.receiver_commits / n,
            }
            for name, p in phases.items()
        },
        "verbs": {v: k / n for v, k in verbs.most_common()},
        "server_xacts_per_op": xacts / n,
        "redis_cmds_per_op": redis_n / n,
    }


# --- HTTP tools ---------------------------------------------------------------------------------


class Receiver:
    """deploy/bench_receiver.py: answers each call after BENCH_HTTP_DELAY_MS and counts the
    distinct Idempotency-Keys it saw."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, str(DEPLOY / "bench_receiver.py"), str(self.port)],
            stdout=subprocess.PIPE,
            stderr=process_log(),
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit("bench: the HTTP receiver did not start; see processes.log")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def ask(self, method: str) -> dict[str, int]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, "/stats" if method == "GET" else "/reset", b"{}")
            return dict(json.loads(conn.getresponse().read()))
        finally:
            conn.close()

    def stop(self) -> None:
        stop(self.process)


def http_tool_declare(url: str) -> str:
    """A declared HTTP tool calling ``url`` (contract replay: the receiver dedupes on the key),
    by an admin; a new name each run (a declaration is for good)."""
    from runtime.accounts import console_user_create
    from runtime.actors import actor_for_user
    from runtime.tool_declarations import tool_declare

    user = console_user_create("bench-admin", "admin", uuid.uuid4().hex)
    name = f"bench.http-{uuid.uuid4().hex[:8]}"
    tool_declare(
        actor_for_user(user.pk, user.username),
        {"name": name, "kind": "http", "contract": "replay", "url": url, "timeout_seconds": 10},
    )
    return name


def celery_threads(env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """Plain Celery's side of the HTTP part: WORKERS worker processes, each a thread pool of
    TOOL_SLOTS (``-P threads -c TOOL_SLOTS``), up once each ran a task."""
    import bench_celery_http
    from django.conf import settings

    slots = str(int(settings.TOOL_SLOTS))
    workers = []
    for _ in range(WORKERS):
        workers.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "bench_celery_http", "worker"),
                    *("-Q", bench_celery_http.QUEUE, "--pool", "threads", "--concurrency", slots),
                    *("--loglevel", "WARNING", "--without-gossip", "--without-mingle"),
                    *("--without-heartbeat", "-n", f"bench_http-{uuid.uuid4().hex[:8]}@%h"),
                ],
                cwd=ROOT,
                env={**env, "PYTHONPATH": f"{DEPLOY}{os.pathsep}{ROOT}", "TOOL_SLOTS": slots},
                stdout=subprocess.DEVNULL,
                stderr=process_log(),
            )
        )
    r = redis_client()
    r.set(bench_celery_http.COUNTER, 0)
    warm = 4 * WORKERS
    for _ in range(warm):
        bench_celery_http.noop.delay()
    wait_until(lambda: int(r.get(bench_celery_http.COUNTER) or 0) >= warm, 90, "Celery threads")
    return workers


def celery_http_round(receiver: Receiver, total: int) -> dict[str, Any]:
    """``total`` calls of the receiver by plain Celery's thread pools, sent as fast as one thread
    sends them: calls per second from the first send to the last call's INCR."""
    import bench_celery_http

    receiver.ask("POST")
    r = redis_client()
    r.set(bench_celery_http.COUNTER, 0)
    r.set(bench_celery_http.FAILED, 0)
    busy = machine_busy()
    run = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for i in range(total):
        bench_celery_http.http_call.delay(receiver.url("/call"), f"celery-{run}-{i}", i)

    def done() -> bool:
        if int(r.get(bench_celery_http.FAILED) or 0):
            raise SystemExit("bench: a plain Celery HTTP call failed; see processes.log")
        return int(r.get(bench_celery_http.COUNTER) or 0) >= total

    wait_until(done, TIMEOUT, "plain Celery's HTTP calls", every=0.005)
    seconds = time.perf_counter() - started
    return {
        "ops_per_s": total / seconds,
        "seconds": seconds,
        "machine_cpu_ms_per_op": (machine_busy() - busy) * 1000 / total,
        "receiver": receiver.ask("GET"),
    }


def http_tools(bench: Bench, stack: Stack, agent: Agent, env: dict[str, str]) -> dict[str, Any]:
    """HTTP tools against plain Celery's thread pool (issue 36): BENCH_HTTP_OPS calls of an HTTP
    tool declared in the console, calling a local receiver that answers in BENCH_HTTP_DELAY_MS,
    proposed over HTTP by the agent processes as the headline's (ops/s from the first send to
    the last acceptance's commit); beside it plain Celery, WORKERS processes with a thread pool
    of TOOL_SLOTS each, whose task calls the same receiver with httpx. BENCH_HTTP_ROUNDS rounds,
    each running both in a shuffled order; the ratio is the median of the rounds' own. The
    receiver counts the distinct keys it saw: one per call on both sides."""
    receiver = Receiver()
    pools: list[subprocess.Popen[bytes]] = []
    rng = random.Random(SEED)
    rounds: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    try:
        tool = http_tool_declare(receiver.url("/call"))
        pools = celery_threads(env)
        for r in range(HTTP_ROUNDS):
            order = ["ours", "celery"]
            rng.shuffle(order)
            got: dict[str, Any] = {"order": order}
            for part in order:
                if part == "ours":
                    receiver.ask("POST")
                    got[part] = ours_http(
                        bench, stack, agent, f"http-{r}", HTTP_OPS, tool=tool, params={}
                    )
                    got[part]["receiver"] = receiver.ask("GET")
                else:
                    got[part] = celery_http_round(receiver, HTTP_OPS)
            got["ratio"] = got["ours"]["ops_per_s"] / got["celery"]["ops_per_s"]
            rounds.append(got)
            log(
                f"http round {r + 1}/{HTTP_ROUNDS}: ours {got['ours']['ops_per_s']:.1f} ops/s "
                f"(receiver: {got['ours']['receiver']}), plain Celery threads "
                f"{got['celery']['ops_per_s']:.1f} ops/s (receiver: {got['celery']['receiver']})"
            )
            load.append(os.getloadavg()[0])
    finally:
        for p in pools:
            stop(p)
        receiver.stop()
    return {"tool": tool, "rounds": rounds, "load_avg_1m": load}


def _http_result(http: dict[str, Any]) -> dict[str, float]:
    rounds = http["rounds"]
    ours = [g["ours"] for g in rounds]
    return {
        "http_tool_ops_per_s": median([o["ops_per_s"] for o in ours]),
        "http_celery_threads_ops_per_s": median([g["celery"]["ops_per_s"] for g in rounds]),
        "ratio_http_vs_celery_threads": median([g["ratio"] for g in rounds]),
        "http_receiver_calls": sum(o["receiver"]["calls"] for o in ours),
        "http_receiver_keys": sum(o["receiver"]["keys"] for o in ours),
        "http_tool_calls": len(ours) * HTTP_OPS,
        "load_avg_1m": max(http["load_avg_1m"]),
    }


def _http_log(http: dict[str, Any]) -> None:
    for g in http["rounds"]:
        o = g["ours"]
        log(
            f"http: ours {o['ops_per_s']:.1f} ops/s, CPU ms/op "
            + ", ".join(f"{k} {v:.1f}" for k, v in o["cpu_ms_per_op"].items())
            + f", proposals answered {o['propose_per_s']:.0f}/s; plain Celery threads "
            f"{g['celery']['ops_per_s']:.1f} ops/s, machine CPU ms/op "
            f"{g['celery']['machine_cpu_ms_per_op']:.1f}"
        )
    log(f"load average (1 min) over the part: {http['load_avg_1m']}")


# --- plain Celery -------------------------------------------------------------------------------


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
        stdout=subprocess.DEVNULL,
        stderr=process_log(),
    )


def celery_pool(concurrency: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Plain Celery's worker pool, up once one no-op ran."""
    import bench_celery

    r = redis_client()
    r.set(bench_celery.COUNTER, 0)
    worker = celery_worker("bench_celery", bench_celery.QUEUE, concurrency, env)
    try:
        bench_celery.noop.delay()
        wait_until(lambda: int(r.get(bench_celery.COUNTER) or 0) >= 1, 90, "the Celery worker")
    except BaseException:
        stop(worker)
        raise
    return worker


def celery_round(total: int) -> dict[str, float]:
    """``total`` no-op tasks sent as fast as one thread sends them: tasks per second from the
    first send to the last run; Redis commands per task from the same window."""
    import bench_celery

    r = redis_client()
    r.set(bench_celery.COUNTER, 0)
    calls = redis_calls()
    busy = machine_busy()
    started = time.perf_counter()
    for _ in range(total):
        bench_celery.noop.delay()
    wait_until(
        lambda: int(r.get(bench_celery.COUNTER) or 0) >= total,
        TIMEOUT,
        "the no-op tasks",
        every=0.005,
    )
    seconds = time.perf_counter() - started
    return {
        "ops_per_s": total / seconds,
        "redis_cmds_per_op": (redis_calls() - calls) / total,
        "machine_cpu_ms_per_op": (machine_busy() - busy) * 1000 / total,
    }


# --- DBOS ---------------------------------------------------------------------------------------


def dbos_url() -> str:
    return (
        urlparse(os.environ["DATABASE_URL"])
        ._replace(scheme="postgresql", path=f"/{DBOS_DB}")
        .geturl()
    )


def dbos_sql(sql: str, params: Any = None) -> Any:
    import psycopg

    with psycopg.connect(dbos_url(), autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else None


def dbos_process(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DEPLOY / "bench_dbos.py"), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=process_log(),
        text=True,
    )


def _ready(processes: list[subprocess.Popen[str]]) -> None:
    for p in processes:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        while line and line != "ready":
            line = p.stdout.readline().strip()
        if line != "ready":
            raise SystemExit("bench: a DBOS process did not start; see var/bench/processes.log")


def _go(processes: list[subprocess.Popen[str]]) -> float:
    start = time.time() + 0.05
    for p in processes:
        assert p.stdin is not None
        p.stdin.write(f"{start!r}\n")
        p.stdin.flush()
    return start


def _last_json(p: subprocess.Popen[str]) -> dict[str, Any]:
    """The result a DBOS process prints once its work is done, read as it arrives: the
    process's shutdown after it (DBOS.destroy) is not the part's work, and its CPU is not
    counted in the part's window (stop() ends the process)."""
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("{"):
            return dict(json.loads(line))
    raise SystemExit("bench: a DBOS process printed no result; see var/bench/processes.log")


def dbos_round(bench: Bench, config: str, label: str) -> dict[str, Any]:
    """One DBOS configuration for one round: ``direct-N`` (N processes calling the workflow
    from DBOS_THREADS threads in all) or ``queue-N`` (N worker processes running the queue,
    DBOS_THREADS at once in all, fed by one separate enqueuer process)."""
    kind, n = config.split("-")
    procs = int(n)
    dbos_sql("VACUUM (ANALYZE)")
    threads = max(1, DBOS_THREADS // procs)
    if kind == "direct":
        per = max(1, DBOS_WORKFLOWS // procs)
        processes = [
            dbos_process("direct", dbos_url(), str(per), str(threads)) for _ in range(procs)
        ]
        try:
            _ready(processes)
            window = Window(bench)
            start = _go(processes)
            for p in processes:
                assert p.stdin is not None
                p.stdin.close()
            results = [_last_json(p) for p in processes]
            window.mark()
        finally:
            for p in processes:
                stop(p)
        total = sum(r["count"] for r in results)
        end = max(r["end"] for r in results)
    else:
        workers = [
            dbos_process("worker", dbos_url(), str(threads), str(DBOS_POLL)) for _ in range(procs)
        ]
        prefix = f"{label}-{uuid.uuid4().hex[:8]}"
        enqueuer = None
        try:
            _ready(workers)  # the queue is registered before anything is enqueued on it
            enqueuer = dbos_process("enqueue", dbos_url(), str(DBOS_WORKFLOWS), prefix)
            _ready([enqueuer])
            window = Window(bench)
            start = _go([enqueuer])
            assert enqueuer.stdin is not None
            enqueuer.stdin.close()
            _last_json(enqueuer)
            total = DBOS_WORKFLOWS
            ids = [f"{prefix}-{i}" for i in range(total)]

            def done() -> bool:
                rows = dbos_sql(
                    "SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) "
                    "AND status = 'SUCCESS'",
                    [ids],
                )
                return int(rows[0][0]) >= total

            wait_until(done, TIMEOUT, f"DBOS {config} to drain", every=0.05)
            window.mark()
            end = (
                float(
                    dbos_sql(
                        "SELECT max(updated_at) FROM dbos.workflow_status "
                        "WHERE workflow_uuid = ANY(%s)",
                        [ids],
                    )[0][0]
                )
                / 1000
            )
        finally:
            for p in workers:
                if p.stdin is not None and not p.stdin.closed:
                    p.stdin.close()
            for p in [*workers, *([enqueuer] if enqueuer else [])]:
                stop(p)
    counts = window.close(total)
    return {
        "ops_per_s": total / max(1e-9, end - start),
        "workflows": total,
        "commits_per_op": counts["dbos_commits_per_op"],
        "wal_bytes_per_op": counts["dbos_wal_bytes_per_op"],
        "xacts_per_op": counts["dbos_xacts_per_op"],
        "machine_cpu_ms_per_op": counts["machine_cpu_ms_per_op"],
    }


# --- the REST floor -----------------------------------------------------------------------------


def floor_server(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """deploy/bench_floor.py served by console.server: the same web server, handler, middleware,
    pool and database as the console, one authenticated INSERT per request."""
    return subprocess.Popen(
        [sys.executable, "-m", "console.server", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "bench_floor",
            "PYTHONPATH": f"{DEPLOY}{os.pathsep}{ROOT}",
            "WEB_LOG_LEVEL": "warning",
        },
        stdout=subprocess.DEVNULL,
        stderr=process_log(),
    )


def floor_round(bench: Bench, port: int, pid: int, agent: Agent, label: str) -> dict[str, Any]:
    agents = Agents(
        port,
        agent.secret,
        {
            "tasks": ["-"],
            "count": FLOOR_REQUESTS,
            "rate": 0,
            "tool": "floor",
            "params": {},
            "label": label,
            "path": "/api/v1/floor",
        },
    )
    cpu = server_cpu(pid)
    window = Window(bench)
    start = agents.start()
    ops, errors = agents.results()
    if errors:
        raise SystemExit(f"bench: {len(errors)} floor requests failed, e.g. {errors[0]}")
    counts = window.close(FLOOR_REQUESTS)
    answered = max(o[3] for o in ops)
    return {
        "floor_rest_per_s": FLOOR_REQUESTS / max(1e-9, answered - start),
        "web_cpu_ms_per_request": (server_cpu(pid) - cpu) * 1000 / FLOOR_REQUESTS,
        "commits_per_op": counts["commits_per_op"],
        "machine_cpu_ms_per_op": counts["machine_cpu_ms_per_op"],
    }


# --- the peers over HTTP (issue 37) ---------------------------------------------------------------


PEER_PARTS = ("drf_celery", "dbos_http")
# BENCH_PARTS=peers: these parts each round, these keys in the RESULT line.
PEER_ROUND_PARTS = ("ours", "floor", *PEER_PARTS)
PEER_KEYS = (
    "ops_per_s",
    "drf_celery_ops_per_s",
    "dbos_http_ops_per_s",
    "ratio_vs_drf_celery",
    "ratio_vs_dbos_http",
    "cpu_ratio_vs_floor",
    "web_cpu_ratio_vs_floor",
    "web_concurrency",
    "commits_per_op",
    "wal_kb_per_op",
    "wal_kb_per_op_no_fpi",
    "api_propose_per_s",
    "web_cpu_ms_per_proposal",
    "floor_rest_per_s",
    "round_trips_per_op",
)


def peer_tables() -> None:
    """The drf_celery peer's table: the row its view inserts and its task marks done."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS bench_peer (id bigserial PRIMARY KEY, actor text NOT NULL,"
            " step text NOT NULL, at timestamptz NOT NULL DEFAULT now(), done_at timestamptz)"
        )


def peer_server(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """deploy/bench_peers.py's views served as the floor is (console.server, the console's
    settings, edge, middleware and pool), in a process of their own so DBOS, launched at the
    first DBOS request, runs beside the peers and not beside the floor."""
    return subprocess.Popen(
        [sys.executable, "-m", "console.server", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "bench_floor",
            "PYTHONPATH": f"{DEPLOY}{os.pathsep}{ROOT}",
            "WEB_LOG_LEVEL": "warning",
            "BENCH_DBOS_URL": dbos_url(),
            "DBOS_POOL": str(DBOS_THREADS),
        },
        stdout=subprocess.DEVNULL,
        stderr=process_log(),
    )


def _peer_post(port: int, secret: str, route: str) -> bool:
    try:
        c = Client(port, secret)
        try:
            step = f"warm-{uuid.uuid4().hex}"
            return c.request("POST", f"/api/v1/peers/{route}", {"step": step})[0] == 201
        finally:
            c.close()
    except OSError:
        return False


def peers_up(port: int, secret: str) -> None:
    """The peers' server answers, and DBOS is launched in it (its first request)."""
    for route in ("drf_celery", "dbos"):
        wait_until(
            lambda route=route: _peer_post(port, secret, route), 90, f"the {route} peer", 0.2
        )


def server_cpu(pid: int) -> float:
    return cpu_seconds([pid, *descendants(pid)])


def peer_round(
    bench: Bench, port: int, pid: int, agent: Agent, peer: str, label: str
) -> dict[str, Any]:
    """One peer for one round: OPS requests over HTTP by the agent processes, as ours; from the
    first send to the last operation done (drf_celery: the row's ``done_at``, set by its Celery
    task; dbos_http: the workflow's ``updated_at`` once SUCCESS)."""
    from django.db import connection

    prefix = f"{label}-{uuid.uuid4().hex[:8]}"
    route = "drf_celery" if peer == "drf_celery" else "dbos"
    agents = Agents(
        port,
        agent.secret,
        {
            "tasks": ["-"],
            "count": OPS,
            "rate": 0,
            "tool": peer,
            "params": {},
            "label": prefix,
            "path": f"/api/v1/peers/{route}",
        },
    )
    if peer == "dbos_http":
        dbos_sql("VACUUM (ANALYZE)")

        def finished() -> tuple[int, float]:
            rows = dbos_sql(
                "SELECT count(*), max(updated_at) FROM dbos.workflow_status "
                "WHERE workflow_uuid LIKE %s AND status = 'SUCCESS'",
                [f"{prefix}-%"],
            )
            return int(rows[0][0]), float(rows[0][1] or 0) / 1000
    else:
        with connection.cursor() as cur:
            cur.execute("VACUUM (ANALYZE) bench_peer")

        def finished() -> tuple[int, float]:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*), extract(epoch FROM max(done_at)) FROM bench_peer "
                    "WHERE step LIKE %s AND done_at IS NOT NULL",
                    [f"{prefix}-%"],
                )
                n, end = cur.fetchone()
            return int(n), float(end or 0)

    cpu = server_cpu(pid)
    window = Window(bench)
    start = agents.start()
    ops, errors = agents.results()
    if errors:
        raise SystemExit(f"bench: {len(errors)} {peer} requests failed, e.g. {errors[0]}")
    web = server_cpu(pid) - cpu
    wait_until(lambda: finished()[0] >= OPS, TIMEOUT, f"the {peer} peer to drain", every=0.02)
    window.mark()
    counts = window.close(OPS)
    end = finished()[1]
    answered = max(o[3] for o in ops)
    return {
        "ops_per_s": OPS / max(1e-9, end - start),
        "propose_per_s": OPS / max(1e-9, answered - start),
        "web_cpu_ms_per_request": web * 1000 / OPS,
        "commits_per_op": counts["commits_per_op"],
        "dbos_commits_per_op": counts["dbos_commits_per_op"],
        "wal_bytes_per_op": counts["wal_bytes_per_op"] + counts["dbos_wal_bytes_per_op"],
        "wal_scanned": counts["wal_scanned"],
        "server_wal_lsn_bytes_per_op": counts["server_wal_lsn_bytes_per_op"],
        "redis_cmds_per_op": counts["redis_cmds_per_op"],
        "machine_cpu_ms_per_op": counts["machine_cpu_ms_per_op"],
    }


# --- HTTP clients and reads -------------------------------------------------------------------


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
    ensure_database(url, DBOS_DB)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
    if re.search(r"/(11|15)$", os.environ["REDIS_URL"]):
        raise SystemExit("bench: Redis dbs 11 and 15 belong to the test suites; use another")
    redis_server, os.environ["REDIS_URL"], redis_note = private_redis(os.environ["REDIS_URL"])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ["WORKERS"] = str(WORKERS)
    os.environ.setdefault("WEB_LOG_LEVEL", "warning")
    # The HTTP tools' part declares a tool calling a receiver on 127.0.0.1: the address guard
    # lets declared HTTP tools reach it only with this switch (runtime.tools.http).
    os.environ["TOOL_ALLOW_PRIVATE_HOSTS"] = "1"
    # The agents' processes share one token: its per-token rate (runtime.throttle, 50 a second
    # by default) would cap every part at it. Measure the path, not the limit.
    os.environ.setdefault("API_RATE_PER_SECOND", "0")
    env = dict(os.environ)
    try:
        return run(env, began, redis_note)
    finally:
        if redis_server is not None:
            stop(redis_server)


def run(env: dict[str, str], began: float, redis_note: str) -> int:
    # What `make run` does first.
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True
    )

    import django

    django.setup()
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, actor text NOT NULL,"
            " body jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())"
        )
    peer_tables()
    bench = Bench()
    parts = Parts(OUT)
    log(
        f"workers={WORKERS} rounds={ROUNDS} ops={OPS} agents={AGENT_PROCS} processes x "
        f"{AGENT_CLIENTS} clients quick={QUICK}; {redis_note}"
    )
    agent = bench_agent("bench-path")
    approver = bench_approver()
    counts = parts.run("counts", ours_counts, agent)
    if counts is not None:
        log(
            f"in-process sample of {SAMPLE}: {counts['round_trips_per_op']:.1f} round trips/op, "
            f"{counts['commits_per_op']:.2f} write commits/op"
        )

    port, floor_port, peers_port = free_port(), free_port(), free_port()
    flush_redis()
    stack = Stack(env, port)
    floor = floor_server(floor_port, env)
    peers = peer_server(peers_port, env)
    noop = None
    rounds: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    rng = random.Random(SEED)
    try:
        if parts.run("stack", stack.ready, agent) is None and "stack" in parts.missing:
            return finish(parts, bench, began, redis_note, counts, rounds, extra)
        if PARTS == "slow":
            slow = slow_tools(bench, stack, agent, "slow")
            _slow_log(slow)
            print("RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in _slow_result(slow).items()))
            return 0
        if PARTS == "http":
            http = http_tools(bench, stack, agent, env)
            _http_log(http)
            print("RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in _http_result(http).items()))
            return 0
        noop = parts.run("celery_pool", celery_pool, WORKERS, env)
        parts.run(
            "floor_up",
            wait_until,
            lambda: _floor_up(floor_port, agent.secret),
            60,
            "the floor's web server",
            0.2,
        )
        peers_ok = parts.run("peers_up", peers_up, peers_port, agent.secret) is not None or (
            "peers_up" not in parts.missing
        )
        log(f"stack up on port {port} (web, worker with {WORKERS} processes, beat)")
        # Each round runs every part once, in its own random order: a noisy minute on a shared
        # host falls on whichever parts ran in it, and no part always runs first or last.
        round_parts: dict[str, Callable[[int, str], Any]] = {
            "ours": lambda r, part: ours_http(bench, stack, agent, f"r{r}", OPS),
            "celery": lambda r, part: celery_round(CELERY_TASKS),
            "floor": lambda r, part: floor_round(bench, floor_port, floor.pid, agent, f"floor-{r}"),
            **{c: (lambda r, part: dbos_round(bench, part, f"r{r}-{part}")) for c in DBOS_CONFIGS},
            **{
                c: (lambda r, part: peer_round(bench, peers_port, peers.pid, agent, part, f"r{r}"))
                for c in PEER_PARTS
            },
        }
        if PARTS == "peers":  # the peers over HTTP beside ours and the floor, nothing else
            round_parts = {k: v for k, v in round_parts.items() if k in PEER_ROUND_PARTS}
        for r in range(ROUNDS):
            order = list(round_parts)
            rng.shuffle(order)
            got: dict[str, Any] = {"order": order}
            for part in order:
                if part in ("celery", "drf_celery") and noop is None:
                    parts.skip(f"r{r}-{part}", "plain Celery's pool did not start")
                    continue
                if part in PEER_PARTS and not peers_ok:
                    parts.skip(f"r{r}-{part}", "the peers' server did not start")
                    continue
                figures = parts.run(f"r{r}-{part}", round_parts[part], r, part)
                if figures is not None:
                    got[part] = figures
            rounds.append(got)
            log(f"round {r + 1}/{ROUNDS}: " + round_line(got))
        headline = [g["ours"]["ops_per_s"] for g in rounds if "ours" in g]
        rate = max(1.0, median(headline) / 2) if headline else 0.0
        if PARTS == "peers":
            return finish(parts, bench, began, redis_note, counts, rounds, extra)
        if rate:
            extra["paced"] = parts.run(
                "paced",
                ours_http,
                bench,
                stack,
                agent,
                "paced",
                max(20, int(rate * PACED_SECONDS)),
                rate=rate,
            )
            if extra["paced"] is not None:
                log(f"paced at {rate:.1f}/s: p50 {extra['paced']['p50_ms']:.1f} ms")
        else:
            parts.skip("paced", "no headline round to pace at half of")
        extra["mixes"] = mixes(parts, bench, stack, agent, port, approver, rng)
        extra["slow_tools"] = parts.run("slow_tools", slow_tools, bench, stack, agent, "slow")
        if extra["slow_tools"] is not None:
            _slow_log(extra["slow_tools"])
        extra["http_tools"] = parts.run("http_tools", http_tools, bench, stack, agent, env)
        if extra["http_tools"] is not None:
            _http_log(extra["http_tools"])
        parts.run("reads", reads, extra, port)
    finally:
        if noop is not None:
            stop(noop)
        stop(floor)
        stop(peers)
        stack.stop()
    return finish(parts, bench, began, redis_note, counts, rounds, extra)


def round_line(got: dict[str, Any]) -> str:
    def rate(part: str, key: str = "ops_per_s") -> str:
        return f"{got[part][key]:.1f}" if part in got else "missing"

    return (
        f"ours {rate('ours')} ops/s (posted {rate('ours', 'propose_per_s')}/s), plain Celery "
        f"{rate('celery')}/s, DBOS "
        + ", ".join(f"{c} {rate(c)}" for c in DBOS_CONFIGS)
        + f", floor {rate('floor', 'floor_rest_per_s')}/s, "
        + ", ".join(f"{c} {rate(c)}/s" for c in PEER_PARTS)
    )


def mixes(
    parts: Parts,
    bench: Bench,
    stack: Stack,
    agent: Agent,
    port: int,
    approver: str,
    rng: random.Random,
) -> dict[str, list[dict[str, Any]]]:
    """The realistic mixes beside the headline, BENCH_MIX_ROUNDS rounds in shuffled orders."""
    runs: dict[str, Callable[[str], Any]] = {
        "tool_30ms": lambda label: ours_http(
            bench, stack, agent, label, MIX_OPS, params={"seconds": 0.03}
        ),
        "budgeted": lambda label: ours_http(
            bench,
            stack,
            agent,
            label,
            MIX_OPS,
            budget={"tool_calls": 10 * MIX_OPS, "cost_cents": 10**6},
        ),
        "approval": lambda label: ours_http(
            bench,
            stack,
            agent,
            label,
            MIX_OPS,
            tool="demo.payments.charge",
            params={"account": "acct_bench", "amount_cents": 20000},
            approver=approve_all(port, approver),
        ),
        "backlog": lambda label: ours_http(bench, stack, agent, label, BACKLOG, hold=True),
        "batch": lambda label: batch_burst(bench, stack, agent, BATCH_OPS, label),
    }
    got: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in range(MIX_ROUNDS):
        order = list(runs)
        rng.shuffle(order)
        for mix in order:
            label = f"{mix}-{m}"
            figures = parts.run(label, runs[mix], label)
            if figures is not None:
                got[mix].append(figures)
                log(f"{label}: {figures['ops_per_s']:.1f} ops/s")
    return dict(got)


def reads(extra: dict[str, Any], port: int) -> dict[str, Any]:
    reader = bench_agent(f"bench-reads-{READ_TASKS}x{READ_EVENTS}")
    seed = seed_reads(reader)
    vacuum()
    extra["reads"] = read_rounds(port, reader, seed)
    extra["seed"] = {k: v for k, v in seed.items() if k != "small"}
    log(
        f"reads: list p99 {extra['reads']['list_p99_ms']:.1f} ms, timeline p99 "
        f"{extra['reads']['timeline_p99_ms']:.1f} ms"
    )
    return extra["reads"]


# --- the figures, whatever parts ended ------------------------------------------------------------


class Parts:
    """Each part's figures, written to BENCH_OUT/parts/<name>.json as the part ends (issue 37):
    a part that raises is logged with its traceback, its file says why, the run goes on, and
    the RESULT line names it as missing. What a later part needs from it is missing too."""

    def __init__(self, out: Path) -> None:
        self.dir = out / "parts"
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("*.json"):
            old.unlink()
        self.missing: list[str] = []
        self.errors: dict[str, str] = {}

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``'s result, written as the part's file; None if it raised
        (SystemExit included: the bench's own refusals end a part, not the run)."""
        try:
            got = fn(*args, **kwargs)
        except (Exception, SystemExit) as exc:
            self.skip(name, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            return None
        self.write(name, {"figures": got})
        return got

    def skip(self, name: str, why: str, trace: str = "") -> None:
        log(f"part {name} missing: {why}")
        if trace:
            with process_log() as f:
                f.write(f"bench part {name} failed:\n{trace}".encode())
        self.missing.append(name)
        self.errors[name] = why
        self.write(name, {"error": why, "traceback": trace})

    def write(self, name: str, body: dict[str, Any]) -> None:
        path = self.dir / f"{name}.json"
        path.write_text(json.dumps({"part": name, **body}, indent=1, default=str))


def _over_floor(rounds: list[dict[str, Any]], ours_key: str, floor_key: str) -> list[float]:
    """Ours' cost per operation over the floor's per request, round by round."""
    return [
        g["ours"][ours_key] / g["floor"][floor_key]
        for g in rounds
        if "ours" in g and "floor" in g and g["floor"][floor_key]
    ]


def measured(values: list[float]) -> float:
    """The median of the values a figure has; none (its parts missing) is no figure."""
    return statistics.median(values)


def _rounds_of(rounds: list[dict[str, Any]], part: str, key: str) -> list[float]:
    return [g[part][key] for g in rounds if part in g]


def _paired(rounds: list[dict[str, Any]], peer: str, peer_key: str = "ops_per_s") -> list[float]:
    """Ours over a peer, round by round, in the rounds where both ran."""
    return [
        g["ours"]["ops_per_s"] / g[peer][peer_key]
        for g in rounds
        if "ours" in g and peer in g and g[peer][peer_key]
    ]


def summarize(
    rounds: list[dict[str, Any]], extra: dict[str, Any], counts: dict[str, Any] | None
) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    """The RESULT line's figures from whatever parts ended: each key computed alone, a key whose
    parts are missing is left out and named. Returns (result, details, missing keys)."""
    dbos_medians = {c: median(v) for c in DBOS_CONFIGS if (v := _rounds_of(rounds, c, "ops_per_s"))}
    best = max(dbos_medians, key=lambda c: dbos_medians[c]) if dbos_medians else ""
    vs_celery, vs_dbos = _paired(rounds, "celery"), _paired(rounds, best) if best else []
    ours = _rounds_of(rounds, "ours", "ops_per_s")

    def ours_median(key: str) -> float:
        return measured(_rounds_of(rounds, "ours", key))

    def mix_median(name: str) -> float:
        return measured([m["ops_per_s"] for m in extra["mixes"][name]])

    spec: dict[str, Callable[[], Any]] = {
        "ops_per_s": lambda: measured(ours),
        "celery_ops_per_s": lambda: measured(_rounds_of(rounds, "celery", "ops_per_s")),
        "dbos_ops_per_s": lambda: dbos_medians[best],
        "ratio_vs_celery": lambda: measured(vs_celery),
        "ratio_vs_dbos": lambda: measured(vs_dbos),
        # Issue 37's peers over HTTP, and the cost over the floor's, round by round.
        "drf_celery_ops_per_s": lambda: measured(_rounds_of(rounds, "drf_celery", "ops_per_s")),
        "dbos_http_ops_per_s": lambda: measured(_rounds_of(rounds, "dbos_http", "ops_per_s")),
        "ratio_vs_drf_celery": lambda: measured(_paired(rounds, "drf_celery")),
        "ratio_vs_dbos_http": lambda: measured(_paired(rounds, "dbos_http")),
        "cpu_ratio_vs_floor": lambda: measured(
            _over_floor(rounds, "machine_cpu_ms_per_op", "machine_cpu_ms_per_op")
        ),
        "web_cpu_ratio_vs_floor": lambda: measured(
            _over_floor(rounds, "web_cpu_ms_per_proposal", "web_cpu_ms_per_request")
        ),
        "web_concurrency": lambda: float(os.environ.get("WEB_CONCURRENCY") or 1),
        "commits_per_op": lambda: ours_median("commits_per_op"),
        "wal_kb_per_op": lambda: (
            measured([wal_bytes(g["ours"]) for g in rounds if "ours" in g]) / 1024
        ),
        "wal_kb_per_op_no_fpi": lambda: (
            measured(
                [
                    g["ours"]["wal_bytes_per_op"] - g["ours"]["wal_fpi_bytes_per_op"]
                    for g in rounds
                    if "ours" in g and g["ours"].get("wal_scanned")
                ]
            )
            / 1024
        ),
        "p50_ms": lambda: extra["paced"]["p50_ms"],
        "p99_ms": lambda: extra["paced"]["p99_ms"],
        "api_propose_per_s": lambda: ours_median("propose_per_s"),
        "rest_ops_per_s": lambda: measured(ours),
        "rest_ratio_vs_celery": lambda: measured(vs_celery),
        "web_cpu_ms_per_proposal": lambda: ours_median("web_cpu_ms_per_proposal"),
        "floor_rest_per_s": lambda: measured(_rounds_of(rounds, "floor", "floor_rest_per_s")),
        "round_trips_per_op": lambda: counts["round_trips_per_op"],  # type: ignore[index]
        "redis_cmds_per_op": lambda: ours_median("redis_cmds_per_op"),
        "batch_ops_per_s": lambda: mix_median("batch"),
        "tool_30ms_ops_per_s": lambda: mix_median("tool_30ms"),
        "budgeted_ops_per_s": lambda: mix_median("budgeted"),
        "approval_ops_per_s": lambda: mix_median("approval"),
        "backlog_ops_per_s": lambda: mix_median("backlog"),
        "list_p99_ms": lambda: extra["reads"]["list_p99_ms"],
        "timeline_p99_ms": lambda: extra["reads"]["timeline_p99_ms"],
        "slow_tools": lambda: _slow_result(extra["slow_tools"]),
        "http_tools": lambda: _http_result(extra["http_tools"]),
    }
    if PARTS == "peers":
        spec = {k: v for k, v in spec.items() if k in PEER_KEYS}
    result, missing = figures(spec)
    details = {
        "rounds": rounds,
        "dbos_best": best,
        "dbos_medians": dbos_medians,
        "ratios": {"celery": vs_celery, "dbos": vs_dbos},
        "intervals": {
            k: bootstrap(v)
            for k, v in (
                ("ratio_vs_celery", vs_celery),
                ("ratio_vs_dbos", vs_dbos),
                ("rest_ratio_vs_celery", vs_celery),
                ("rest_ops_per_s", ours),
                ("ops_per_s", ours),
            )
            if v
        },
    }
    return result, details, missing


def wal_bytes(part: dict[str, Any]) -> float:
    """A part's WAL bytes per operation: the bench database's from the WAL scan when its
    segments were still there, else the server's position moved (every database: an upper
    bound on a shared server)."""
    if part.get("wal_scanned", True) and part.get("wal_bytes_per_op"):
        return float(part["wal_bytes_per_op"])
    return float(part.get("server_wal_lsn_bytes_per_op", 0.0))


def figures(spec: dict[str, Callable[[], Any]]) -> tuple[dict[str, float], list[str]]:
    """Each figure of ``spec`` computed alone (a function may give several, as a dict); the
    keys whose parts are missing, named instead."""
    result: dict[str, float] = {}
    missing: list[str] = []
    for key, compute in spec.items():
        try:
            value = compute()
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
            missing.append(key)
            continue
        if isinstance(value, dict):
            result.update(value)
        else:
            result[key] = float(value)
    return result, missing


def result_line(result: dict[str, float], missing_parts: list[str], missing: list[str]) -> str:
    """The RESULT line: every figure there is, then what is missing (parts, then keys)."""
    line = "RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in result.items())
    if missing_parts or missing:
        line += " missing=" + ",".join([*missing_parts, *missing])
    return line


def finish(
    parts: Parts,
    bench: Bench | None,
    began: float,
    redis_note: str,
    counts: dict[str, Any] | None,
    rounds: list[dict[str, Any]],
    extra: dict[str, Any],
) -> int:
    """The report and the RESULT line, from whatever parts ended: the full report when every
    part it shows is there, else result.json and a short report naming what is missing (with
    each part's file under parts/). Returns 0 when nothing is missing, 1 otherwise."""
    from bench_report import write_partial_report, write_report

    result, summary, missing = summarize(rounds, extra, counts)
    details = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": QUICK,
        "workers": WORKERS,
        "round_count": ROUNDS,
        "ops": OPS,
        "agent_procs": AGENT_PROCS,
        "agent_clients": AGENT_CLIENTS,
        "tool": f"{HEADLINE_TOOL} {json.dumps(HEADLINE_PARAMS)}",
        "dbos_threads": DBOS_THREADS,
        "dbos_poll": DBOS_POLL,
        "counts": counts,
        "redis_note": redis_note,
        "statements_note": bench.statements_note if bench else "",
        "walinspect": bench.walinspect if bench else False,
        "seed": SEED,
        "load": os.getloadavg(),
        "cores": os.cpu_count() or 1,
        "seconds": time.perf_counter() - began,
        "missing_parts": parts.missing,
        "part_errors": parts.errors,
        "missing_keys": missing,
        **summary,
        **extra,
    }
    try:
        path = (
            write_report(OUT, result=result, details=details)
            if PARTS == "all" and not parts.missing and not missing
            else write_partial_report(OUT, result=result, details=details)
        )
    except Exception:  # the full report's shape needs every part: keep the figures anyway
        log(f"the report failed, writing the short one:\n{traceback.format_exc()}")
        path = write_partial_report(OUT, result=result, details=details)
    log(f"report: {path} ({time.perf_counter() - began:.0f} s in all)")
    print(result_line(result, parts.missing, missing), flush=True)
    return 1 if parts.missing or missing else 0


def _slow_result(slow: dict[str, Any]) -> dict[str, float]:
    full = slow["slots_full"]["processes"]
    return {
        "slow_ops_per_s": slow["ops_per_s"],
        "slow_in_flight": slow["in_flight_avg"],
        "slow_worker_rss_mb": max((p["rss_mb"] for p in full), default=0.0),
    }


def _slow_log(slow: dict[str, Any]) -> None:
    full = slow["slots_full"]
    log(
        f"slow tools: {slow['ops']} calls of {SLOW_SECONDS:g} s, {slow['ops_per_s']:.1f} ops/s, "
        f"{slow['in_flight_avg']:.1f} in flight on average (peak {slow['in_flight_peak']}), "
        f"calls per process {slow['calls_per_process']}; CPU ms/op "
        + ", ".join(f"{k} {v:.1f}" for k, v in slow["cpu_ms_per_op"].items())
        + f", proposals answered {slow['propose_per_s']:.0f}/s; "
        f"slots full ({full['slots']} a process, "
        f"{full['calls']} calls): "
        + ", ".join(
            f"pid {p['pid']} {p['calls']} calls {p['threads']} threads "
            f"{p['rss_mb']:.0f} MB (peak {p['peak_rss_mb']:.0f} MB)"
            for p in full["processes"]
        )
        + "; before the part: "
        + ", ".join(
            f"pid {pid} {m['threads']} threads {m['rss_mb']:.0f} MB"
            for pid, m in full["before"].items()
            if m
        )
    )


def _floor_up(port: int, secret: str) -> bool:
    try:
        c = Client(port, secret)
        try:
            return c.request("POST", "/api/v1/floor", {"warm": True})[0] == 201
        finally:
            c.close()
    except OSError:
        return False


def fmt(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
