"""Shared fixtures: the suite runs against real PostgreSQL and Redis (``make test`` sets
DATABASE_URL and REDIS_URL), starts real Celery worker processes and the real web server
(console.server: uvicorn) against the test database, and drives a real Chromium."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.test import override_settings
from structlog.contextvars import clear_contextvars

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("DATABASE_URL"):
        skip = pytest.mark.skip(reason="needs PostgreSQL: run through `make test`")
        for item in items:
            if "postgres" in item.keywords or "workers" in item.keywords:
                item.add_marker(skip)


def _flush_by_delete(
    self: Any, style: Any, tables: list[str], *, reset_sequences: bool = False, **kw: Any
) -> list[str]:
    """PostgreSQL's flush (pytest-django's after each ``transactional_db`` test) as DELETEs in
    one transaction instead of one TRUNCATE: TRUNCATE makes new files for each of the ~50
    tables and their indexes, 1.5-3 s per test on the CI machine, where a test's few rows are
    deleted in a few milliseconds. Foreign keys are checked at the commit (Django makes them
    DEFERRABLE), when every table is empty; the second round deletes what the first one's
    triggers wrote (the task counters that runtime_task's DELETE trigger keeps)."""
    if reset_sequences or not tables:
        return list(_TRUNCATE_FLUSH(self, style, tables, reset_sequences=reset_sequences, **kw))
    deletes = [f"DELETE FROM {self.quote_name(table)};" for table in tables]
    return ["SET CONSTRAINTS ALL DEFERRED;", *deletes, *deletes]


_TRUNCATE_FLUSH = PostgresOperations.sql_flush
# The sqlite3 backend imports its operations through its base module (a direct import of the
# operations module first is a circular import in Django).
SQLiteOperations = SQLiteWrapper.ops_class
_SQLITE_FLUSH = SQLiteOperations.sql_flush


def _sqlite_flush_twice(self: Any, style: Any, tables: list[str], **kw: Any) -> list[str]:
    """SQLite's flush is DELETEs already: as on PostgreSQL, a second round deletes what the
    first one's triggers wrote (runtime_task's DELETE trigger moves the task counters), or the
    next test starts with counters below zero."""
    statements = list(_SQLITE_FLUSH(self, style, tables, **kw))
    return [*statements, *[s for s in statements if s.startswith("DELETE")]]


@pytest.fixture(scope="session", autouse=True)
def _cheap_flush() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PostgresOperations, "sql_flush", _flush_by_delete)
        patch.setattr(SQLiteOperations, "sql_flush", _sqlite_flush_twice)
        yield


@pytest.fixture(scope="session", autouse=True)
def _quick_password_hashes() -> Iterator[None]:
    with override_settings(
        PASSWORD_HASHERS=["tests.hashers.QuickPBKDF2PasswordHasher", *settings.PASSWORD_HASHERS]
    ):
        yield


@pytest.fixture(autouse=True)
def _nothing_bound_for_logs() -> None:
    """A request's id stays bound in the context that served it (console.logformat: the
    server's lines about it come after the middleware), and the test client serves in the
    test's own: nothing bound by one test's requests names the next test's lines."""
    clear_contextvars()


@pytest.fixture(autouse=True)
def _fresh_execution_identity() -> Iterator[None]:
    """A test's database is rolled back or flushed after it: this process's cached Execution id
    must not outlive the row it names."""
    from runtime import executions

    executions._current.clear()
    yield
    executions._current.clear()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "",
    pause: Callable[[float], Any] = time.sleep,
) -> Any:
    """Poll until ``predicate()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        pause(interval)


def journal_note(task_id: str, reason: str) -> None:
    """Append a neutral event to a task's journal (as any accepted change would)."""
    from django.db import transaction
    from django.utils import timezone

    from runtime.events import event_append_txn

    with transaction.atomic():
        event_append_txn(
            task_id=task_id,
            type="task.note",
            state_version=1,
            now=timezone.now(),
            actor="user:test",
            data={"reason": reason},
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_database_url() -> str:
    """The URL of the database this test session uses (pytest-django's test database)."""
    conf = connection.settings_dict
    user = quote(conf.get("USER") or "")
    password = quote(conf.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = conf.get("HOST") or "127.0.0.1"
    port = conf.get("PORT") or "5432"
    return f"postgres://{auth}{host}:{port}/{conf['NAME']}"


def service_env(**overrides: Any) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "COV_")) and k != "DJANGO_SETTINGS_MODULE"
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "DATABASE_URL": test_database_url(),
            "REDIS_URL": os.environ["REDIS_URL"],
            "PYTHONUNBUFFERED": "1",
            "CONN_MAX_AGE": "0",
        }
    )
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def redis_flush() -> None:
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


def broker_idle() -> bool:
    """Whether every message sent to the workers' queues has been consumed: no queue holds a
    message and none is delivered but unacknowledged (tasks acknowledge late, after they ran:
    kombu keeps those in its ``unacked`` hash). A test that sends duplicates polls this before
    asserting what the duplicates did."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    for queue in settings.CELERY_QUEUES:
        # A queue is one list per priority step, named after the queue.
        for key in client.scan_iter(match=f"{queue}*"):
            if client.type(key) == b"list" and client.llen(key):
                return False
    return not client.hlen("unacked")


@dataclass
class Worker:
    """One real ``celery worker`` process (main) with its prefork children."""

    proc: subprocess.Popen[bytes]
    log: Path
    name: str
    asked_to_stop: bool = False

    def children(self) -> list[int]:
        try:
            out = subprocess.run(
                ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
            ).stdout
        except FileNotFoundError:  # pragma: no cover
            return []
        return [int(p) for p in out.split()]

    def kill_children(self) -> list[int]:
        pids = self.children()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        self.stop_asked()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                for pid in self.children():
                    os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stop_asked(self) -> None:
        """Ask once for Celery's warm shutdown (SIGTERM), without waiting for it."""
        if self.proc.poll() is None and not self.asked_to_stop:
            self.proc.send_signal(signal.SIGTERM)
            self.asked_to_stop = True

    def tail(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""


@dataclass
class WorkerPool:
    tmp: Path
    workers: list[Worker] = field(default_factory=list)

    def start(
        self, count: int = 1, concurrency: int = 1, queues: str = "", **env: Any
    ) -> list[Worker]:
        from runtime.models import Execution

        started = []
        for _ in range(count):
            n = len(self.workers) + 1
            log = self.tmp / f"worker-{n}.log"
            # Unless told its queues, one pool reads every queue (the notifications' own too).
            cmd = [
                sys.executable, "-m", "celery", "-A", "console", "worker",
                "--pool", "prefork", "--concurrency", str(concurrency),
                "-Q", queues or ",".join(settings.CELERY_QUEUES), "--loglevel", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"test-{n}-{os.getpid()}@%h",
            ]  # fmt: skip
            env.setdefault("LEASE_SECONDS", 30)
            with log.open("wb") as fh:
                proc = subprocess.Popen(
                    cmd, cwd=ROOT, env=service_env(**env), stdout=fh, stderr=subprocess.STDOUT
                )
            worker = Worker(proc, log, f"test-{n}")
            self.workers.append(worker)
            started.append(worker)
        for worker in started:
            # Ready once every prefork child registered its Execution.
            wait_for(
                lambda w=worker: (
                    len(w.children()) >= concurrency
                    and Execution.objects.filter(pid__in=w.children()).count() >= concurrency
                ),
                timeout=60,
                what=f"worker {worker.name} to start:\n{worker.tail()}",
            )
        return started

    def start_beat(self, **env: Any) -> Worker:
        """Start beat (``manage.py beat``): the sweeper runs every SWEEP_SECONDS in its own
        process, as in production."""
        log = self.tmp / f"beat-{len(self.workers) + 1}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "beat"],
                cwd=ROOT,
                env=service_env(**env),
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        beat = Worker(proc, log, "beat")
        self.workers.append(beat)
        return beat

    def start_supervised(
        self, concurrency: int = 1, only: str = "worker,beat", **env: Any
    ) -> Worker:
        """Start workers (and beat) the way `make run` does: under its supervisor, which
        restarts a process that dies."""
        from django.utils import timezone

        from runtime.models import Execution

        since = timezone.now()
        log = self.tmp / f"supervised-{len(self.workers) + 1}.log"
        env.setdefault("LEASE_SECONDS", 30)
        env["WORKERS"] = concurrency
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "runstack", "--only", only],
                cwd=ROOT,
                env=service_env(**env),
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        stack = Worker(proc, log, "supervised")
        self.workers.append(stack)
        wait_for(
            lambda: (
                Execution.objects.filter(kind="worker", started_at__gte=since).count()
                >= concurrency
            ),
            timeout=60,
            what=f"supervised workers to start:\n{stack.tail()}",
        )
        return stack

    def stop_all(self) -> None:
        # Every process is asked first: they shut down side by side (an idle worker's warm
        # shutdown takes some 3 s, mostly its pool's).
        for worker in self.workers:
            worker.stop_asked()
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def workers(transactional_db: None, tmp_path: Path) -> Iterator[WorkerPool]:
    """Start real Celery worker processes against the test database and Redis."""
    redis_flush()
    pool = WorkerPool(tmp_path)
    try:
        yield pool
    finally:
        pool.stop_all()
        redis_flush()


class LogSince:
    """The part of a log written since this view was made: a test that reads the log of a
    server kept across its module's tests (KeptProcesses) reads its own part, as it read the
    whole log of a server started for it alone."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read_bytes(self) -> bytes:
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read()

    def read_text(self) -> str:
        return self.read_bytes().decode(errors="replace")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path | LogSince

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except Exception:
        return False


def server_start(tmp_path: Path, **env: Any) -> Server:
    """Start the real web server (console.server: uvicorn, HTTP + websockets) on the test
    database, as `make run` and deploy/ start it."""
    port = free_port()
    log = tmp_path / f"web-{port}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.server", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=service_env(**env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_for(
            lambda: http_ok(f"{server.url}/healthz"),
            timeout=60,
            what=f"the web server to serve:\n{log.read_text()[-3000:]}",
        )
    except BaseException:
        server.stop()
        raise
    return server


# The web server's connections (console.settings.database_pooled).
WEB_APPLICATION_NAME = "agent-console-web"


def web_requests_done() -> bool:
    """Whether no web server on the test database is inside a transaction: every request it
    served has ended (an idle pooled connection holds no lock)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND state <> 'idle'",
            [WEB_APPLICATION_NAME],
        )
        return not cur.fetchone()[0]


@dataclass
class KeptProcesses:
    """Web servers a test module keeps running across its tests, one per environment: starting
    one costs seconds, and it keeps nothing of a test that the next one could see (its state is
    the database, flushed between tests, and Redis; its caches are keyed by ids no other test
    has). Each test gets a handle whose log is its own part (LogSince)."""

    tmp: Path
    servers: dict[tuple[tuple[str, str], ...], Server] = field(default_factory=dict)

    def server(self, **env: Any) -> Server:
        """The module's server for ``env``, started on first use or when the last one died."""
        key = tuple(sorted((k, str(v)) for k, v in env.items()))
        srv = self.servers.get(key)
        if srv is not None and not (srv.proc.poll() is None and http_ok(f"{srv.url}/healthz")):
            srv.stop()
            srv = None
        if srv is None:
            srv = self.servers[key] = server_start(self.tmp, **env)
        assert isinstance(srv.log, Path)
        return Server(srv.url, srv.proc, LogSince(srv.log))

    def settle(self) -> None:
        """Called as a test ends, before its database is flushed: wait for the servers to end
        the requests the test left running, and stop one that does not (the flush would wait
        for its locks, and what it wrote afterwards would be the next test's)."""
        if not self.servers:
            return
        try:
            wait_for(web_requests_done, timeout=15, what="the kept web servers' requests to end")
        except Exception:
            self.stop()

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()
        self.servers.clear()


@pytest.fixture(scope="module")
def kept_processes(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeptProcesses]:
    kept = KeptProcesses(tmp_path_factory.mktemp("kept"))
    try:
        yield kept
    finally:
        kept.stop()


@pytest.fixture
def server(transactional_db: None, kept_processes: KeptProcesses) -> Iterator[Server]:
    """The real web server serving the app on the test database: one per module, kept across
    its tests (KeptProcesses), the database flushed between them as for any test."""
    yield kept_processes.server()
    kept_processes.settle()


@dataclass
class PrivateRedis:
    """A Redis server of the test's own, so a test can stop and restart its broker without
    disturbing anything else on the machine."""

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *("redis-server", "--bind", "127.0.0.1", "--port", str(self.port)),
                *("--save", "", "--appendonly", "no", "--dir", str(self.dir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis.from_url(self.url)

        def up() -> bool:
            try:
                return bool(client.ping())
            except Exception:
                return False

        wait_for(up, timeout=20, what="private redis to start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    instance = PrivateRedis(free_port(), tmp_path)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


def rate_limits_clear() -> None:
    """Forget the brute-force counters (Redis keys; database rows roll back with the test)."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match="ratelimit:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture(autouse=True)
def _rate_limit_counters() -> Iterator[None]:
    # Failed logins and tokens of one test must not use up the next test's attempts.
    rate_limits_clear()
    yield


# --- the generated client -----------------------------------------------------------------


@dataclass
class GeneratedClient:
    """A Python client openapi-python-client made from the API's schema (what /api/schema/
    serves): the package ``package`` under ``path``, and what the generator said."""

    package: str
    path: Path
    returncode: int
    stdout: str
    stderr: str


# The artifact's bytes are served with their own media type, so the schema says */*; the
# generator is told to treat that as bytes (its documented content_type_overrides). No
# formatter run: the client must import as made.
GENERATOR_CONFIG = 'post_hooks: []\ncontent_type_overrides:\n  "*/*": application/octet-stream\n'


@pytest.fixture(scope="session")
def generated_client(tmp_path_factory: pytest.TempPathFactory) -> GeneratedClient:
    """Generated once per session (seconds of the generator's time), by the document the
    server's /api/schema/?format=json serves, asked of the same view in this process (it reads
    no database). Tests assert on the generator's exit and output themselves."""
    from django.test import Client

    where = tmp_path_factory.mktemp("generated-client")
    schema = where / "schema.json"
    answer = Client().get("/api/schema/?format=json")
    assert answer.status_code == 200, answer.content[:300]
    schema.write_bytes(answer.content)
    config = where / "config.yaml"
    config.write_text(GENERATOR_CONFIG)
    package = "console_api_client"
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("openapi-python-client")),
            *("generate", "--path", str(schema), "--output-path", str(where / package)),
            *("--meta", "none", "--config", str(config)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return GeneratedClient(package, where, result.returncode, result.stdout, result.stderr)


# --- artifact storage backends ------------------------------------------------------------


@dataclass
class MotoServer:
    """moto's S3 in server mode, a process of its own spoken to over real HTTP."""

    url: str
    proc: subprocess.Popen[bytes]

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    server = MotoServer(f"http://127.0.0.1:{port}", proc)

    def up() -> bool:
        try:
            server.client().list_buckets()
            return True
        except Exception:
            return False

    try:
        wait_for(up, timeout=60, what=f"moto server:\n{log.read_text()[-2000:]}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


_bucket_n = iter(range(1, 1_000_000))


def s3_storage_settings(server: MotoServer) -> dict[str, Any]:
    bucket = f"artifacts-{os.getpid()}-{next(_bucket_n)}"
    server.client().create_bucket(Bucket=bucket)
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": server.url,
            "access_key": "test",
            "secret_key": "test",
            "region_name": "us-east-1",
            "file_overwrite": False,
        },
    }


@pytest.fixture
def fs_artifacts(settings: Any, tmp_path: Path) -> Path:
    """Artifacts on the filesystem under this test's own directory."""
    root = tmp_path / "artifacts"
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(root)},
        },
    }
    return root


@pytest.fixture(params=["filesystem", "s3"])
def artifact_backend(request: pytest.FixtureRequest, settings: Any, tmp_path: Path) -> str:
    """Each test runs once on the filesystem and once on S3 (moto over HTTP)."""
    if request.param == "s3":
        backend = s3_storage_settings(request.getfixturevalue("moto_server"))
    else:
        backend = {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "artifacts")},
        }
    settings.STORAGES = {**settings.STORAGES, "artifacts": backend}
    return str(request.param)
