"""Kill soak (docs/soak.md): a few hundred mixed operations over every receiver contract, with
approvals, budgets, child tasks and artifacts, while worker children are SIGKILLed at random,
Redis is stopped and restarted and PostgreSQL is restarted once. Everything runs against a
PostgreSQL cluster and a Redis server the soak starts for itself (never the shared servers).
At the end it waits (bounded) until the work settled and prints one Jepsen-style line:

    acknowledged N lost 0 duplicates 0 unresolved K (evidence K) budgets balanced journals gapless

    python deploy/soak.py --ops 300 [--seed 1] [--json out.json] [--keep]

The exit status is 0 when the line holds (lost 0, duplicates 0, every unresolved operation has
evidence, budgets balanced, journals gapless, and the kills and restarts happened), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import io
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LEASE_SECONDS = 2
FAST = {
    "LEASE_SECONDS": str(LEASE_SECONDS),
    "SWEEP_SECONDS": "1",
    "OUTBOX_GRACE_SECONDS": "1",
    "RETRY_BASE_SECONDS": "0.1",
    "RETRY_CAP_SECONDS": "0.5",
    # A message a killed child held comes back soon rather than in five minutes (the sweeper
    # would re-dispatch it anyway: Redis is never the record).
    "BROKER_VISIBILITY_TIMEOUT": "10",
    "CONN_MAX_AGE": "0",
    "DEMO_TOOLS": "1",
    "LOG_LEVEL": "WARNING",
}
BUDGET_CENTS = 1_000_000
CHILD_CENTS = 2_000
ECHO_ESTIMATE = 50
MIN_DRIVE_SECONDS = 20
LIVE = ("pending", "running", "retry_scheduled", "waiting_approval", "compensating", "waiting")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --- the soak's own servers ------------------------------------------------------------------


class Postgres:
    """A throwaway cluster: initdb into a temp dir, pg_ctl start/stop. initdb refuses root, so as
    root the cluster belongs to the ``postgres`` user and its commands run through runuser."""

    def __init__(self, base: Path) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins and not shutil.which("initdb"):
            raise RuntimeError("no initdb found (/usr/lib/postgresql/*/bin/initdb)")
        self.bin = Path(bins[-1]).parent if bins else Path(shutil.which("initdb") or "").parent
        self.dir = base / "pg"
        self.port = free_port()
        self.log = base / "postgres.log"
        self.as_root = os.geteuid() == 0

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        full = [str(self.bin / cmd[0]), *cmd[1:]]
        if self.as_root:
            full = ["runuser", "-u", "postgres", "--", *full]
        return subprocess.run(full, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> None:
        self.dir.mkdir(parents=True)
        if self.as_root:
            shutil.chown(self.dir.parent, "postgres")
            shutil.chown(self.dir, "postgres")
            self.log.touch()
            shutil.chown(self.log, "postgres")
        self._run("initdb", "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        opts = (
            # fsync off survives a crash of the server (the OS keeps its writes), which is all
            # the soak does; synchronous_commit stays on: off, a crash forgets acknowledged
            # commits, and the soak would count losses the database itself caused.
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.dir), "-o", opts, "-l", str(self.log), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.dir), "-m", mode, "-w", "stop", check=False)

    def url(self, db: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')


class Redis:
    def __init__(self, base: Path) -> None:
        self.port = free_port()
        self.dir = base
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *("redis-server", "--bind", "127.0.0.1", "--port", str(self.port)),
                *("--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(self.dir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=1)

        def up() -> bool:
            try:
                return bool(client.ping())
            except Exception:
                return False

        wait(up, 20, "the soak's redis to start", 0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --- the stack: Celery workers and beat, restarted when they die -------------------------------


@dataclass
class Proc:
    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def children(self) -> list[int]:
        if self.proc is None:
            return []
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]


class Stack:
    def __init__(self, base: Path, env: dict[str, str], workers: int, concurrency: int) -> None:
        self.env = env
        self.procs: list[Proc] = []
        py = sys.executable
        for n in range(1, workers + 1):
            cmd = [
                *(py, "-m", "celery", "-A", "console", "worker"),
                # The work queue and the notifications' own (settings.CELERY_QUEUES' defaults).
                *("--pool", "prefork", "--concurrency", str(concurrency)),
                *("-Q", "operations,notifications"),
                *("--loglevel", "WARNING", "--without-gossip", "--without-mingle"),
                *("--without-heartbeat", "-n", f"soak-{n}-{os.getpid()}@%h"),
            ]
            self.procs.append(Proc(f"worker-{n}", cmd, base / f"worker-{n}.log"))
        self.procs.append(Proc("beat", [py, "manage.py", "beat"], base / "beat.log"))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _spawn(self, p: Proc) -> None:
        with p.log.open("ab") as fh:
            p.proc = subprocess.Popen(
                p.cmd, cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT
            )

    def start(self) -> None:
        for p in self.procs:
            self._spawn(p)
        self._thread.start()

    def _watch(self) -> None:
        # A main process that exited (it may, while its broker or database is away) is started
        # again, as the supervisor of `make run` would.
        while not self._stop.wait(0.5):
            with self._lock:
                for p in self.procs:
                    if p.proc is not None and p.proc.poll() is not None:
                        p.restarts += 1
                        self._spawn(p)

    @property
    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith("worker")]

    def kill_random_child(self, rng: random.Random) -> int | None:
        pids = [pid for p in self.workers for pid in p.children()]
        if not pids:
            return None
        pid = rng.choice(pids)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            return pid
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for p in self.procs:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p.proc is None:
                continue
            try:
                p.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                for pid in p.children():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                p.proc.kill()
                p.proc.wait(timeout=10)

    def logs(self) -> str:
        return "".join(p.log.read_text(errors="replace") for p in self.procs if p.log.exists())


# --- chaos -------------------------------------------------------------------------------------


@dataclass
class Chaos:
    child_kills: int = 0
    redis_restarts: int = 0
    postgres_restarts: int = 0
    worker_restarts: int = 0
    db_errors_retried: int = 0


def chaos_loop(
    stop: threading.Event,
    progress: Callable[[], float],
    stack: Stack,
    redis: Redis,
    pg: Postgres,
    chaos: Chaos,
    rng: random.Random,
) -> None:
    """Kill a worker child every second or so; stop Redis for a few seconds once a third of the
    operations were proposed (and again at two thirds); restart PostgreSQL (immediate stop: a
    crash, then recovery) once at half."""
    redis_marks = [0.3, 0.7]
    pg_marks = [0.5]
    while not stop.wait(rng.uniform(0.5, 1.5)):
        if stack.kill_random_child(rng) is not None:
            chaos.child_kills += 1
        done = progress()
        if redis_marks and done >= redis_marks[0]:
            redis_marks.pop(0)
            redis.stop()
            stop.wait(rng.uniform(2.0, 4.0))
            redis.start()
            chaos.redis_restarts += 1
        if pg_marks and done >= pg_marks[0]:
            pg_marks.pop(0)
            pg.stop("immediate")
            stop.wait(rng.uniform(1.0, 3.0))
            pg.start()
            chaos.postgres_restarts += 1


# --- the driver: agents propose, an operator approves -----------------------------------------


SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("demo.echo", {}),
    ("demo.echo", {"_fault": "transient:2"}),
    ("demo.echo", {"_fault": "crash_before_effect"}),
    ("demo.echo", {"_fault": "crash_after_effect"}),
    ("demo.echo", {"_fault": "unknown"}),
    ("demo.echo", {"_fault": "hang"}),
    ("demo.payments.charge", {}),
    ("demo.payments.charge", {"_fault": "transient:1"}),
    ("demo.payments.charge", {"_fault": "crash_before_effect"}),
    ("demo.payments.charge", {"_fault": "crash_after_effect"}),
    ("demo.payments.charge", {"_fault": "unknown"}),
    ("demo.payments.charge", {"_fault": "hang"}),
    ("demo.payments.charge", {"approval": True}),
    ("demo.payments.charge", {"approval": True, "_fault": "crash_after_effect"}),
    ("demo.inventory.reserve", {}),
    ("demo.inventory.reserve", {"_fault": "transient:1"}),
    ("demo.inventory.reserve", {"_fault": "crash_before_effect"}),
    ("demo.inventory.reserve", {"_fault": "crash_after_effect"}),
    ("demo.inventory.reserve", {"_fault": "unknown"}),
    ("demo.inventory.reserve", {"_fault": "hang"}),
    ("demo.notify", {}),
    ("demo.notify", {"_fault": "transient:1"}),
    ("demo.notify", {"_fault": "crash_before_effect"}),
    ("demo.notify", {"_fault": "crash_after_effect"}),
    ("demo.notify", {"_fault": "unknown"}),
]


@dataclass
class Acked:
    operations: dict[str, str] = field(default_factory=dict)  # id -> tool
    artifacts: dict[str, str] = field(default_factory=dict)  # id -> sha256 of the bytes sent
    refused: Counter[str] = field(default_factory=Counter)
    approvals_decided: int = 0
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)


def durable(chaos: Chaos, fn: Callable[[], Any], attempts: int = 120) -> Any:
    """Call a service through PostgreSQL's restart and Redis' absence: on a connection error,
    drop the connection and call again. The services are idempotent by key, so a call whose
    commit was acknowledged but whose answer was lost returns the same record the second time."""
    from django.db import Error as DbError
    from django.db import connections

    from runtime.errors import DatabaseBusy, RequestInProgress

    for n in range(attempts):
        try:
            return fn()
        except (DbError, RequestInProgress, DatabaseBusy, ConnectionError, OSError):
            if n == attempts - 1:
                raise
            chaos.db_errors_retried += 1
            connections.close_all()
            time.sleep(0.5)
    raise AssertionError("unreachable")


def drive(ops: int, rng: random.Random, chaos: Chaos, acked: Acked, counter: list[int]) -> None:
    from runtime.accounts import console_user_create
    from runtime.actors import actor_for_agent, actor_for_user
    from runtime.approvals import approval_decide
    from runtime.artifacts import UploadSpec, artifact_upload
    from runtime.errors import DomainError
    from runtime.models import Approval
    from runtime.specs import OperationSpec
    from runtime.tasks import TaskSpec, task_create
    from runtime.tokens import token_issue_for_agent
    from runtime.transitions.propose import operation_propose

    issued = token_issue_for_agent("soak-agent")
    assert issued.token.agent is not None
    agent = actor_for_agent(issued.token.agent.pk, issued.token.agent.name)
    user = console_user_create("soak-operator", "operator", secrets_password())
    operator = actor_for_user(user.pk, "soak-operator")

    def new_parent() -> Any:
        task = durable(
            chaos,
            lambda: task_create(
                agent,
                TaskSpec(
                    name=f"soak parent {len(acked.parents) + 1}",
                    budget={"cost_cents": BUDGET_CENTS},
                    compensate_on=["cancelled", "failed"],
                ),
            ),
        )
        acked.parents.append(task.pk)
        return task

    def new_child(parent: Any) -> Any:
        task = durable(
            chaos,
            lambda: task_create(
                agent,
                TaskSpec(
                    name=f"soak child {len(acked.children) + 1}",
                    parent=parent.pk,
                    budget={"cost_cents": CHILD_CENTS},
                ),
            ),
        )
        acked.children.append(task.pk)
        return task

    def approve_pending() -> None:
        pending = durable(
            chaos,
            lambda: list(
                Approval.objects.filter(status="pending").values_list("pk", "params_hash")[:50]
            ),
        )
        for approval_id, digest in pending:
            try:
                durable(
                    chaos,
                    lambda a=approval_id, d=digest: approval_decide(
                        operator, a, decision="approve", reason="soak", params_hash=d
                    ),
                )
                acked.approvals_decided += 1
            except DomainError:
                pass  # decided meanwhile (a retried call whose first try committed)

    pace = max(0.03, MIN_DRIVE_SECONDS / max(ops, 1))
    parents = [new_parent() for _ in range(3)]
    children = [new_child(rng.choice(parents)) for _ in range(3)]
    for i in range(ops):
        counter[0] = i
        r = rng.random()
        if r < 0.05:
            children.append(new_child(rng.choice(parents)))
            continue
        if r < 0.12:
            task = rng.choice(parents)
            data = f"soak artifact {i} {rng.random()}".encode()
            try:
                artifact = durable(
                    chaos,
                    lambda t=task, d=data, n=i: artifact_upload(
                        agent,
                        t.pk,
                        UploadSpec(name=f"report-{n}.txt", media_type="text/plain"),
                        io.BytesIO(d),
                    ),
                )
                acked.artifacts[artifact.pk] = hashlib.sha256(data).hexdigest()
            except DomainError as exc:
                acked.refused[type(exc).__name__] += 1
            continue
        in_child = rng.random() < 0.25
        task = rng.choice(children if in_child else parents)
        tool, shape = rng.choice(SHAPES)
        params: dict[str, Any] = {k: v for k, v in shape.items() if k != "approval"}
        estimate: dict[str, float] = {}
        if tool == "demo.echo":
            params["n"] = i
            estimate = {"cost_cents": ECHO_ESTIMATE}
            # Usage never above its estimate: an overrun is allowed by design (spent money is
            # posted), and the soak checks the strict balance.
            params["_usage"] = {"cost_cents": rng.randint(0, ECHO_ESTIMATE)}
        elif tool == "demo.payments.charge":
            high = shape.get("approval")
            params.update(
                account=f"acct-{i % 7}",
                amount_cents=rng.randint(10_001, 50_000) if high else rng.randint(1, 10_000),
            )
        elif tool == "demo.inventory.reserve":
            params.update(sku=f"sku-{i % 5}", qty=rng.randint(1, 9))
        else:
            params.update(to=f"ops{i}@example.com", message=f"soak {i}")
        spec = OperationSpec(tool=tool, step=f"s{i}", params=params, estimate=estimate)
        try:
            op, _ = durable(chaos, lambda t=task, s=spec: operation_propose(agent, t.pk, s))
            acked.operations[op.pk] = tool
        except DomainError as exc:
            # Refused (a child's allowance used up, a task that ended): never acknowledged.
            acked.refused[type(exc).__name__] += 1
        if i % 5 == 0:
            approve_pending()
        # Paced so that even a short run lasts long enough for the kills and outages to land
        # while its work is in flight.
        time.sleep(rng.uniform(0.0, 2 * pace))
    counter[0] = ops
    approve_pending()


def secrets_password() -> str:
    import secrets

    return secrets.token_urlsafe(18)


def settle(chaos: Chaos, acked: Acked, timeout: float) -> bool:
    """Approve what still waits for a person, then wait (bounded) until no acknowledged
    operation is live; then end the children (their usage lands in their parents) and the
    parents."""
    from runtime.approvals import approval_decide
    from runtime.completion import task_complete
    from runtime.errors import DomainError
    from runtime.models import Approval, Operation

    operator = durable(chaos, _operator)
    deadline = time.monotonic() + timeout
    settled = False
    while time.monotonic() < deadline:
        for approval_id, digest in durable(
            chaos,
            lambda: list(
                Approval.objects.filter(status="pending").values_list("pk", "params_hash")
            ),
        ):
            with contextlib.suppress(DomainError):
                durable(
                    chaos,
                    lambda a=approval_id, d=digest: approval_decide(
                        operator, a, decision="approve", reason="soak", params_hash=d
                    ),
                )
                acked.approvals_decided += 1
        live = durable(chaos, lambda: Operation.objects.filter(status__in=LIVE).count())
        if not live:
            settled = True
            break
        time.sleep(0.5)
    agent = durable(chaos, _agent)
    for task_id in [*acked.children, *acked.parents]:
        with contextlib.suppress(DomainError):
            durable(
                chaos, lambda t=task_id: task_complete(agent, t, if_unresolved="end_unresolved")
            )
    return settled


def _agent() -> Any:
    from runtime.actors import actor_for_agent
    from runtime.models import Agent

    a = Agent.objects.get(name="soak-agent")
    return actor_for_agent(a.pk, a.name)


def _operator() -> Any:
    from django.contrib.auth import get_user_model

    from runtime.actors import actor_for_user

    u = get_user_model().objects.get(username="soak-operator")
    return actor_for_user(u.pk, u.username)


# --- the verdict: computed from the database and the receivers' own records ---------------------


@dataclass
class Verdict:
    acknowledged: int = 0
    lost: int = 0
    duplicates: int = 0
    unresolved: int = 0
    evidence: int = 0
    budgets_balanced: bool = True
    journals_gapless: bool = True
    settled: bool = False
    statuses: dict[str, int] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)
    duplicate_keys: list[str] = field(default_factory=list)
    no_evidence_ids: list[str] = field(default_factory=list)
    budget_faults: list[str] = field(default_factory=list)
    journal_faults: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        return (
            f"acknowledged {self.acknowledged} lost {self.lost} duplicates {self.duplicates} "
            f"unresolved {self.unresolved} (evidence {self.evidence}) "
            f"budgets {'balanced' if self.budgets_balanced else 'UNBALANCED'} "
            f"journals {'gapless' if self.journals_gapless else 'GAPPED'}"
        )

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicates == 0
            and self.evidence == self.unresolved
            and self.budgets_balanced
            and self.journals_gapless
        )


# A receiver that promises at most one effect per key under the runtime's use of it: payments
# dedupe by key (replay), inventory is looked up before any second call (lookup), and a
# notification with an unconfirmed send goes to a person instead of being sent again (none).
AT_MOST_ONCE = {
    "demo.payments.charge": "payments",
    "demo.inventory.reserve": "inventory",
    "demo.notify": "notify",
}


def verdict(acked: Acked, settled: bool) -> Verdict:
    from django.db.models import Count, Sum
    from django.utils import timezone

    from runtime.models import (
        Artifact,
        BudgetHold,
        BudgetMeter,
        Event,
        Invocation,
        Operation,
        OutboxMessage,
        Task,
        UsageRecord,
    )
    from runtime.rules.statuses import OperationStatus as S
    from runtime.sandbox import receivers
    from runtime.sandbox.models import Charge, Notification, Reservation
    from runtime.selectors.artifacts import artifact_content

    v = Verdict(settled=settled)
    now = timezone.now()
    ops = {o.pk: o for o in Operation.objects.filter(pk__in=list(acked.operations))}
    v.acknowledged = len(acked.operations) + len(acked.artifacts)
    v.statuses = dict(Counter(o.status for o in ops.values()))
    queued = set(
        OutboxMessage.objects.filter(operation_id__in=list(ops)).values_list(
            "operation_id", flat=True
        )
    )
    # Evidence: an invocation that records the dispatch and what became of it (unknown, lost,
    # a receipt), and the reason the operation went to a person.
    evidence = Counter(
        Invocation.objects.filter(operation_id__in=list(ops), outcome__isnull=False).values_list(
            "operation_id", flat=True
        )
    )
    for op_id in acked.operations:
        op = ops.get(op_id)
        if op is None:
            v.lost += 1
            v.lost_ids.append(f"{op_id} (missing)")
            continue
        if op.status in S.FINAL or op.status in (S.EXPIRED, S.MANUAL_INTERVENTION):
            continue
        if op.status == S.UNRESOLVED:
            v.unresolved += 1
            if evidence[op_id] and (op.status_reason or op.error):
                v.evidence += 1
            else:
                v.no_evidence_ids.append(op_id)
            continue
        owned = (
            (op.status == S.RUNNING and op.lease_expires_at and op.lease_expires_at > now)
            or (op.status in (S.PENDING, S.RETRY_SCHEDULED) and (op_id in queued))
            or (op.status == S.RETRY_SCHEDULED and op.next_attempt_at is not None)
            or op.status == S.WAITING_APPROVAL
        )
        if not owned:
            v.lost += 1
            v.lost_ids.append(f"{op_id} ({op.tool} {op.status})")
    for artifact_id, digest in acked.artifacts.items():
        art = Artifact.objects.filter(pk=artifact_id).first()
        if art is None or art.status not in ("stored", "accepted", "superseded"):
            v.lost += 1
            v.lost_ids.append(f"{artifact_id} (artifact {art.status if art else 'missing'})")
            continue
        _, content = artifact_content(_agent(), artifact_id)
        with content:
            if hashlib.sha256(content.read()).hexdigest() != digest:
                v.lost += 1
                v.lost_ids.append(f"{artifact_id} (artifact bytes differ)")

    # Duplicates, from the receivers' own records: per acknowledged operation's key, and over
    # every key the receivers saw (compensations included).
    for op_id, tool in acked.operations.items():
        receiver = AT_MOST_ONCE.get(tool)
        op = ops.get(op_id)
        if receiver is None or op is None:
            continue
        effects = [
            e
            for e in receivers.effects_under(receiver, op.idempotency_key)
            if e.get("kind") != "refund"
        ]
        if len(effects) > 1:
            v.duplicates += len(effects) - 1
            v.duplicate_keys.append(f"{op_id} {op.idempotency_key} x{len(effects)}")
    per_key = {
        "payments": Charge.objects.values("key", "kind"),
        "inventory": Reservation.objects.values("key"),
        "notify": Notification.objects.values("key"),
    }
    known = {k.split(" ")[1] for k in v.duplicate_keys}
    for name, rows in per_key.items():
        for row in rows.annotate(n=Count("pk")).filter(n__gt=1):
            if row["key"] not in known:
                v.duplicates += row["n"] - 1
                v.duplicate_keys.append(f"- {row['key']} x{row['n']} ({name})")

    # Budgets: every meter within its limit, its amounts equal to its holds and usage records,
    # and every ended child's consumption posted in its parent.
    held = {
        (r["meter_id"], r["status"]): r["s"]
        for r in BudgetHold.objects.values("meter_id", "status").annotate(s=Sum("amount"))
    }
    used = {
        r["meter_id"]: r["s"]
        for r in UsageRecord.objects.values("meter_id").annotate(s=Sum("amount"))
    }
    for m in BudgetMeter.objects.all():
        if m.limit < m.reserved + m.posted + m.unknown:
            v.budget_faults.append(
                f"{m.task_id}/{m.meter}: limit {m.limit} < reserved {m.reserved} + posted "
                f"{m.posted} + unknown {m.unknown}"
            )
        if m.reserved != (held.get((m.pk, "held")) or 0):
            v.budget_faults.append(f"{m.task_id}/{m.meter}: reserved {m.reserved} != its holds")
        if m.unknown != (held.get((m.pk, "unknown")) or 0):
            v.budget_faults.append(f"{m.task_id}/{m.meter}: unknown {m.unknown} != its holds")
        if m.posted != (used.get(m.pk) or 0):
            v.budget_faults.append(f"{m.task_id}/{m.meter}: posted {m.posted} != its usage")
    for child in Task.objects.filter(pk__in=acked.children, condition="terminal"):
        # An ended child that may still spend (an operation left with a person, whose resolution
        # may start a compensation; a compensation under way; a child of its own still going)
        # keeps its whole allocation held in the parent until it can spend no more.
        may_spend = (
            Operation.objects.filter(
                task=child, status__in=("unresolved", "manual_intervention", "compensating")
            ).exists()
            or Task.objects.filter(parent=child).exclude(condition="terminal").exists()
        )
        if may_spend:
            if not BudgetHold.objects.filter(child_task=child, status="held").exists():
                v.budget_faults.append(
                    f"child {child.pk} may still spend but its parent's hold was settled"
                )
            continue
        child_posted = (
            BudgetMeter.objects.filter(task=child, meter="cost_cents").aggregate(s=Sum("posted"))[
                "s"
            ]
            or 0
        )
        in_parent = (
            UsageRecord.objects.filter(child_task=child, meter__task_id=child.parent_id).aggregate(
                s=Sum("amount")
            )["s"]
            or 0
        )
        if child_posted != in_parent:
            v.budget_faults.append(
                f"child {child.pk}: posted {child_posted} but {in_parent} in parent"
            )
        if BudgetHold.objects.filter(child_task=child, status="held").exists():
            v.budget_faults.append(f"child {child.pk} ended with its parent's hold still held")
    v.budgets_balanced = not v.budget_faults

    # Journals: seq 1..n per task, n the task's own counter.
    for task in Task.objects.all():
        seqs = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
        if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != task.event_seq:
            v.journal_faults.append(f"{task.pk}: {len(seqs)} events, counter {task.event_seq}")
    v.journals_gapless = not v.journal_faults
    return v


class _Rollback(Exception):
    pass


def checker_bites(acked: Acked, settled: bool) -> dict[str, bool | None]:
    """The verdict must not be true by construction: inside a transaction that is rolled back,
    plant one fault of each kind into the settled state (a second charge under an acknowledged
    key, an acknowledged operation set back to pending with no dispatch intent, an unresolved
    operation's invocations removed, a meter reserving past its limit, an event cut out of a
    journal) and check the verdict names each. None: nothing to plant it on in this run."""
    from django.db import transaction
    from django.utils import timezone

    from runtime.models import BudgetMeter, Event, Invocation, Operation, OutboxMessage
    from runtime.sandbox.models import Charge

    caught: dict[str, bool | None] = {}
    try:
        with transaction.atomic():
            ops = Operation.objects.filter(pk__in=list(acked.operations))
            charge = Charge.objects.filter(
                kind="charge", key__in=ops.values("idempotency_key")
            ).first()
            if charge is not None:
                Charge.objects.create(
                    charge_id=f"ch_planted_{charge.pk}",
                    key=charge.key,
                    account=charge.account,
                    amount_cents=charge.amount_cents,
                    fencing_token=charge.fencing_token,
                    created_at=timezone.now(),
                )
            done = ops.filter(status="succeeded").exclude(tool="demo.payments.charge").first()
            if done is not None:
                OutboxMessage.objects.filter(operation=done).delete()
                Operation.objects.filter(pk=done.pk).update(status="pending")
            unresolved = ops.filter(status="unresolved").first()
            if unresolved is not None:
                Invocation.objects.filter(operation=unresolved).delete()
            meter = BudgetMeter.objects.first()
            if meter is not None:
                BudgetMeter.objects.filter(pk=meter.pk).update(reserved=meter.limit + 1)
            event = Event.objects.filter(seq=2).first()
            if event is not None:
                Event.objects.filter(pk=event.pk).delete()
            planted = verdict(acked, settled)
            caught = {
                "duplicate": None if charge is None else planted.duplicates > 0,
                "lost": None if done is None else done.pk in " ".join(planted.lost_ids),
                "evidence": None
                if unresolved is None
                else unresolved.pk in planted.no_evidence_ids,
                "budget": None if meter is None else not planted.budgets_balanced,
                "journal": None if event is None else not planted.journals_gapless,
            }
            raise _Rollback
    except _Rollback:
        pass
    return caught


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=int(os.environ.get("SOAK_OPS") or 300))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED") or 1))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--settle-seconds", type=float, default=180)
    parser.add_argument("--json", default="", help="also write the counts here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, cluster)")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="soak-"))
    pg = Postgres(base)
    redis = Redis(base)
    stack: Stack | None = None
    chaos = Chaos()
    acked = Acked()
    started = time.monotonic()
    try:
        pg.init()
        pg.start()
        pg.create_database("soak")
        redis.start()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "COV_")) and k not in ("TEST_DATABASE_NAME",)
        }
        env.update(FAST)
        env.update(
            DJANGO_SETTINGS_MODULE="console.settings",
            DATABASE_URL=pg.url("soak"),
            REDIS_URL=redis.url,
            CONSOLE_DATA_DIR=str(base / "data"),
            ARTIFACT_ROOT=str(base / "artifacts"),
            PYTHONUNBUFFERED="1",
        )
        os.environ.clear()
        os.environ.update(env)
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        # The driver's own retries through the outages are counted; the runtime's warnings about
        # an unreachable broker would only bury the verdict.
        logging.getLogger("runtime").setLevel(logging.CRITICAL)
        logging.getLogger("celery").setLevel(logging.CRITICAL)
        logging.getLogger("kombu").setLevel(logging.CRITICAL)
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        from runtime.models import Execution

        stack = Stack(base, env, args.workers, args.concurrency)
        stack.start()
        wait(
            lambda: (
                Execution.objects.filter(kind="worker").count() >= args.workers * args.concurrency
            ),
            90,
            "the workers to start",
        )
        counter = [0]
        stop = threading.Event()
        chaos_thread = threading.Thread(
            target=chaos_loop,
            args=(stop, lambda: counter[0] / max(args.ops, 1), stack, redis, pg, chaos, rng),
            daemon=True,
        )
        chaos_thread.start()
        drive(args.ops, random.Random(args.seed + 1), chaos, acked, counter)
        # Let the chaos finish what it owes (every planned restart) before settling.
        wait(
            lambda: chaos.postgres_restarts >= 1 and chaos.redis_restarts >= 2,
            60,
            "the planned restarts",
            0.2,
        )
        stop.set()
        chaos_thread.join(timeout=30)
        settled = settle(chaos, acked, args.settle_seconds)
        chaos.worker_restarts = sum(p.restarts for p in stack.procs)
        result = verdict(acked, settled)
        bites = checker_bites(acked, settled)
        logs = stack.logs()
        print(result.line, flush=True)
        print(
            f"chaos: {chaos.child_kills} worker children killed, {chaos.redis_restarts} redis "
            f"restarts, {chaos.postgres_restarts} postgres restart(s), "
            f"{chaos.worker_restarts} worker/beat restarts, {chaos.db_errors_retried} client "
            f"retries; {acked.approvals_decided} approvals, {len(acked.children)} children, "
            f"{len(acked.artifacts)} artifacts; statuses {result.statuses}; refused "
            f"{dict(acked.refused)}; settled {settled} in {time.monotonic() - started:.0f}s",
            flush=True,
        )
        print(f"the verdict catches planted faults: {bites}", flush=True)
        for title, items in (
            ("lost", result.lost_ids),
            ("duplicate", result.duplicate_keys),
            ("unresolved without evidence", result.no_evidence_ids),
            ("budget", result.budget_faults),
            ("journal", result.journal_faults),
        ):
            for item in items[:20]:
                print(f"  {title}: {item}", flush=True)
        deadlocks = logs.count("deadlock detected")
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        **asdict(result),
                        "line": result.line,
                        "ok": result.ok,
                        "chaos": asdict(chaos),
                        "approvals": acked.approvals_decided,
                        "children": len(acked.children),
                        "artifacts": len(acked.artifacts),
                        "deadlocks": deadlocks,
                        "checker_bites": bites,
                        "base": str(base),
                    },
                    indent=2,
                )
            )
        happened = (
            chaos.child_kills > 0 and chaos.redis_restarts > 0 and chaos.postgres_restarts > 0
        )
        bitten = all(v is not False for v in bites.values())
        return 0 if result.ok and happened and bitten else 1
    finally:
        if stack is not None:
            stack.stop()
        redis.stop()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        pg.stop("fast")
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"kept {base}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
