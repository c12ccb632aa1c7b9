"""Settings for both ways to run.

Embedded (no environment): SQLite in WAL mode, Celery on kombu's SQLAlchemy transport over its
own SQLite file, the in-memory channel layer, filesystem storage. Services: ``DATABASE_URL``
selects PostgreSQL, ``REDIS_URL`` selects the Redis broker and channels-redis.
``CONSOLE_ENV=production`` turns on the production hardening (and requires ``SECRET_KEY`` and
``ALLOWED_HOSTS``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

# The project's tree (templates/, static/, manage.py): beside the packages in a checkout; an
# image that installs the packages (not editable) names where it copied them (deploy/Dockerfile).
BASE_DIR = Path(os.environ.get("CONSOLE_HOME") or Path(__file__).resolve().parent.parent)
DATA_DIR = Path(os.environ.get("CONSOLE_DATA_DIR", BASE_DIR / "var"))
DATA_DIR.mkdir(parents=True, exist_ok=True)

CONSOLE_ENV = os.environ.get("CONSOLE_ENV", "development")
PRODUCTION = CONSOLE_ENV == "production"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _required(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"CONSOLE_ENV=production needs {name} in the environment")
    return value


if PRODUCTION:
    SECRET_KEY = _required("SECRET_KEY")
    ALLOWED_HOSTS = [h.strip() for h in _required("ALLOWED_HOSTS").split(",") if h.strip()]
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS names no host")
    DEBUG = False
else:
    SECRET_KEY = os.environ.get("SECRET_KEY", "dev-insecure-key-not-for-production-use-0123456789")
    ALLOWED_HOSTS = [
        h.strip()
        for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")
        if h.strip()
    ]
    DEBUG = os.environ.get("DEBUG", "0") == "1"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "runtime",
    "runtime.sandbox",
    "console",
]

MIDDLEWARE = [
    # First, so request latency covers the whole chain (console.metrics).
    "console.metrics.RequestMetricsMiddleware",
    # The request id on every line of the request, and in its response (console.logformat).
    "console.logformat.RequestIdMiddleware",
    "console.logformat.WorkContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.middleware.SecurityHeadersMiddleware",
    "console.middleware.ErrorMappingMiddleware",
    "console.middleware.InputEdgeMiddleware",
]

ROOT_URLCONF = "console.urls"
# The console's own 403 (Django's has inline style, which the Content-Security-Policy blocks).
CSRF_FAILURE_VIEW = "console.web.views.csrf_failure"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.web.context.console_context",
            ],
        },
    }
]


def database_pooled(database: dict[str, Any], max_size: int) -> None:
    """Make ``database`` (a PostgreSQL DATABASES entry) pool its connections, in a process that
    has not connected yet: the web server (console.server). ASGI runs each request's sync code
    in a thread of its own, where a persistent connection is never reused, so every request
    opened a PostgreSQL backend of its own. Workers keep their one persistent connection."""
    if max_size <= 0 or database.get("ENGINE") != "django.db.backends.postgresql":
        return
    database["CONN_MAX_AGE"] = 0  # Django's pool and persistent connections do not mix
    # Django's PostgreSQL backend, its pool checking a connection by its socket, not a query.
    database["ENGINE"] = "console.pgpool"
    database["OPTIONS"] = {
        **database.get("OPTIONS", {}),
        "application_name": "agent-console-web",
        "pool": {"min_size": 1, "max_size": max_size, "timeout": 10},
    }


def _database_from_url(url: str) -> dict[str, object]:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"DATABASE_URL must be postgres://..., got scheme {parsed.scheme!r}")
    options: dict[str, object] = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    # The hot path's statements bind on the server (runtime.db.prepared_cursor); psycopg
    # prepares each after this many runs on a connection, so PostgreSQL stops parsing and
    # planning them per operation. Django turns preparing off by default for poolers: behind
    # PgBouncer in transaction mode it needs 1.21+ with max_prepared_statements, else set
    # DB_PREPARE_THRESHOLD=off.
    threshold = str(options.pop("prepare_threshold", os.environ.get("DB_PREPARE_THRESHOLD", "5")))
    options["prepare_threshold"] = (
        None if threshold.lower() in ("", "off", "none") else int(threshold)
    )
    if options["prepare_threshold"] is not None:
        # And plans them once: left to choose, PostgreSQL kept planning the data-modifying CTEs
        # anew for every run (a custom plan each time), which the profile showed as a tenth of
        # its CPU under load. Only statements prepared on the server are affected, and those
        # are the hot path's, all primary-key or id-array lookups that a generic plan serves.
        options.setdefault("options", "-c plan_cache_mode=force_generic_plan")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        # One persistent connection per process, kept across Celery tasks; the web server
        # pools instead (database_pooled): the two do not mix, PITFALLS.md.
        "CONN_MAX_AGE": _env_int("CONN_MAX_AGE", 60),
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": options,
        "TEST": {"NAME": os.environ.get("TEST_DATABASE_NAME") or None},
    }


DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": _database_from_url(DATABASE_URL)}
    EMBEDDED_DATABASE = False
else:
    EMBEDDED_DATABASE = True
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "console.sqlite3",
            # Verified on this machine kind: WAL + IMMEDIATE + timeout gives exactly one winner
            # per guarded update across processes without "database is locked".
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }

# Connections the web server pools per process (console.server and its worker processes, which
# it marks with CONSOLE_WEB_SERVER: they pool as they load these settings).
DB_POOL_MAX = _env_int("DB_POOL_MAX", 20)
if os.environ.get("CONSOLE_WEB_SERVER"):
    database_pooled(DATABASES["default"], DB_POOL_MAX)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
EMBEDDED_BROKER = not REDIS_URL
# How long the channel layer waits for Redis to answer a read (see CHANNEL_LAYERS below).
CHANNELS_SOCKET_TIMEOUT = 15.0

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # A socket's receive blocks in BZPOPMIN for up to 5 s (channels_redis's
                # RedisChannelLayer.brpop_timeout); redis-py 8 gives every read a 5 s timeout by
                # default, so an idle socket's receive failed and closed it every 5 s. The read
                # timeout must outlast that block; it still bounds a read on a dead connection.
                "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNELS_SOCKET_TIMEOUT}],
                "prefix": os.environ.get("CHANNELS_PREFIX", "asgi"),
            },
        }
    }
else:
    CELERY_BROKER_URL = f"sqla+sqlite:///{DATA_DIR / 'broker.sqlite3'}"
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Knobs of API.md.
LEASE_SECONDS = _env_int("LEASE_SECONDS", 30)
# Keys of the lease tokens' HMAC (runtime.lease_tokens), comma-separated: the first signs, all
# verify. Rotate by putting the new key first and dropping the old one once no lease or
# replayable claim it signed is needed. Empty: derived from SECRET_KEY and its fallbacks.
LEASE_TOKEN_KEYS = [
    k.strip() for k in os.environ.get("LEASE_TOKEN_KEYS", "").split(",") if k.strip()
]
# Keys of the approval seals' HMAC (runtime.approval_seal), comma-separated: the first seals,
# all verify. Rotate by putting the new key first; an approval sealed by a dropped key goes back
# to a person at release. Empty: derived from SECRET_KEY and its fallbacks.
APPROVAL_SEAL_KEYS = [
    k.strip() for k in os.environ.get("APPROVAL_SEAL_KEYS", "").split(",") if k.strip()
]
SWEEP_SECONDS = _env_int("SWEEP_SECONDS", 5)
# An item of a people's queue (an approval request, an unresolved operation) taken and then
# forgotten goes back to everyone's "to do" this many minutes after it was taken or handed over
# (runtime.worklist; taking it again renews it).
CLAIM_RETURN_MINUTES = _env_int("CLAIM_RETURN_MINUTES", 30)
# Who else has a queue page open (runtime.presence): each open page says it is still there every
# third of this many seconds; one not heard of for this long (a killed tab, a lost network)
# drops out of the others' "Also here".
PRESENCE_SECONDS = float(os.environ.get("PRESENCE_SECONDS") or 30.0)
WORKERS = _env_int("WORKERS", 2)
# Outbox rows that no claim consumed within this many seconds of becoming due are published again.
OUTBOX_GRACE_SECONDS = _env_int("OUTBOX_GRACE_SECONDS", max(2 * SWEEP_SECONDS, 5))
# Drainers (runtime.drainers): under a backlog a worker claims up to DRAIN_BATCH quick
# calls in one transaction and accepts their reports in one more; 0 turns batches off. A drain
# session yields its process after DRAIN_SECONDS (or DRAIN_IDLE_SECONDS without work); a killed
# drainer's registration lapses after DRAIN_LEASE_SECONDS.
DRAIN_BATCH = _env_int("DRAIN_BATCH", 32)
# A worker starts draining a queue when this many messages wait for it in the broker and fewer
# than DRAINERS_PER_QUEUE drain it already.
DRAIN_BACKLOG = _env_int("DRAIN_BACKLOG", 4)
DRAINERS_PER_QUEUE = _env_int("DRAINERS_PER_QUEUE", 1)
DRAIN_SECONDS = float(os.environ.get("DRAIN_SECONDS") or 5.0)
# A drainer leaves once its list stayed empty this long.
DRAIN_IDLE_SECONDS = float(os.environ.get("DRAIN_IDLE_SECONDS") or 0.1)
DRAIN_LEASE_SECONDS = _env_int("DRAIN_LEASE_SECONDS", 5)
# A drainer whose batch was not full takes its next batch no sooner than this after the last,
# so batches gather while proposals arrive slower than it runs them.
DRAIN_INTERVAL_SECONDS = float(os.environ.get("DRAIN_INTERVAL_SECONDS") or 0.01)
# Server-sent events are woken by journal hints; with hints (services mode) the journal is read
# on this slow timer only as a safety net against a lost hint.
SSE_SAFETY_POLL_SECONDS = _env_int("SSE_SAFETY_POLL_SECONDS", 2)
# An MCP tool call (console.mcp) waits this long at most for its operation to settle before
# answering "not settled yet" (console.get_result fetches it later); woken as the events are.
MCP_CALL_WAIT_SECONDS = float(os.environ.get("MCP_CALL_WAIT_SECONDS") or 20.0)
CELERY_QUEUE = os.environ.get("CELERY_QUEUE", "operations")
# Retries: full-jitter exponential backoff, uniform over [0, min(cap, base * 2^(n-1))].
RETRY_BASE_SECONDS = float(os.environ.get("RETRY_BASE_SECONDS") or 1.0)
RETRY_CAP_SECONDS = float(os.environ.get("RETRY_CAP_SECONDS") or 60.0)
# Limits (issue 11). The share of every budget meter kept for cleanup (compensations, checks):
# ordinary work cannot spend it.
BUDGET_RESERVE_PERCENT = _env_int("BUDGET_RESERVE_PERCENT", 10)


def _env_map(name: str) -> dict[str, int]:
    """``tool_class=N,other=M`` -> {tool_class: N, other: M}."""
    out: dict[str, int] = {}
    for part in (os.environ.get(name) or "").split(","):
        if "=" in part:
            key, _, value = part.partition("=")
            out[key.strip()] = int(value)
    return out


def _env_names(name: str) -> dict[str, str]:
    """``tool_class=queue,other=queue2`` -> {tool_class: queue, other: queue2}."""
    out: dict[str, str] = {}
    for part in (os.environ.get(name) or "").split(","):
        if "=" in part:
            key, _, value = part.partition("=")
            if key.strip() and value.strip():
                out[key.strip()] = value.strip()
    return out


# A queue per tool class: operations of a class named here are published to its own Celery
# queue (workers choose theirs with -Q), so slow or rate-limited tools cannot starve quick
# ones; every other class goes to CELERY_QUEUE. Notifications (runtime/tools/notify.py, class
# "notify") have NOTIFY_QUEUE unless TOOL_QUEUES names another: a dead webhook, retried with
# backoff for up to a day, then holds the notifier pool's slots, never the work queue's.
NOTIFY_QUEUE = os.environ.get("NOTIFY_QUEUE") or "notifications"
TOOL_QUEUES = {"notify": NOTIFY_QUEUE, **_env_names("TOOL_QUEUES")}
# Every queue of this deployment: the default one first, then the tool classes' own.
CELERY_QUEUES = list(dict.fromkeys([CELERY_QUEUE, *TOOL_QUEUES.values()]))
# The default process layout (make run, deploy/): the work pool reads every queue but the
# notifications' own, which a pool of NOTIFY_WORKERS processes reads.
WORK_QUEUES = [q for q in CELERY_QUEUES if q == CELERY_QUEUE or q != TOOL_QUEUES["notify"]]
NOTIFY_WORKERS = _env_int("NOTIFY_WORKERS", 1)
# Admission control per tool class: at most N running at once, at most M admitted and waiting.
TOOL_CONCURRENCY = _env_map("TOOL_CONCURRENCY")
TOOL_QUEUE_CAPACITY = _env_map("TOOL_QUEUE_CAPACITY")
# A worker-run operation that has not stopped this long after its cancel was requested is ended
# by its worker (the child process is terminated; a call in a slot is settled and left).
CANCEL_GRACE_SECONDS = float(os.environ.get("CANCEL_GRACE_SECONDS") or 10.0)
# Calls of tools that wait (io_bound or async: docs/tools.md) are made side by side, up to
# TOOL_SLOTS at once in each worker process (runtime.slots; 0: one at a time, as other calls).
# They write through a pool of at most TOOL_SLOT_DB_POOL database connections per process.
TOOL_SLOTS = _env_int("TOOL_SLOTS", 128)
TOOL_SLOT_DB_POOL = _env_int("TOOL_SLOT_DB_POOL", 4)
# How long Redis keeps an unacknowledged message before delivering it again; duplicates are
# harmless (the claim is the dedupe), so this only bounds how long a lost worker's message waits.
BROKER_VISIBILITY_TIMEOUT = _env_int("BROKER_VISIBILITY_TIMEOUT", 300)

# Brute-force limits (runtime/ratelimits.py): attempts per window, per account and per client
# address, for logins and for failed token authentications. Counted in Redis when REDIS_URL is
# set, in the database otherwise.
RATE_WINDOW_SECONDS = _env_int("RATE_WINDOW_SECONDS", 300)
RATE_LOGIN_PER_ACCOUNT = _env_int("RATE_LOGIN_PER_ACCOUNT", 10)
RATE_LOGIN_PER_ADDRESS = _env_int("RATE_LOGIN_PER_ADDRESS", 50)
# After RATE_LOGIN_PER_ACCOUNT failures in a row, each further one makes the username wait
# twice as long as the last (from the base), at most the max: a delay, never a lock.
RATE_LOGIN_DELAY_BASE_SECONDS = _env_int("RATE_LOGIN_DELAY_BASE_SECONDS", 1)
RATE_LOGIN_DELAY_MAX_SECONDS = _env_int("RATE_LOGIN_DELAY_MAX_SECONDS", 60)
RATE_TOKEN_PER_ACCOUNT = _env_int("RATE_TOKEN_PER_ACCOUNT", 10)
RATE_TOKEN_PER_ADDRESS = _env_int("RATE_TOKEN_PER_ADDRESS", 50)
# Requests per API token (runtime/throttle.py), whatever the token acts as: a burst of
# API_RATE_BURST at once, API_RATE_PER_SECOND sustained; 0 turns it off. Sessions are not
# limited by it.
API_RATE_PER_SECOND = float(os.environ.get("API_RATE_PER_SECOND") or 50)
API_RATE_BURST = _env_int("API_RATE_BURST", 200)
# How often an open event stream re-checks that its token was not revoked.
TOKEN_RECHECK_SECONDS = float(os.environ.get("TOKEN_RECHECK_SECONDS") or 2.0)

# The bearer token a Prometheus scraper presents at /metrics (admins may read it without): unset,
# only admins can (runtime.policy_features.can_read_metrics).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")

# Demo tools (simulated receivers and fault knobs): on unless production, overridable.
DEMO_TOOLS = os.environ.get("DEMO_TOOLS", "0" if PRODUCTION else "1") == "1"
# A team's own tools (docs/tools.md): import paths, comma-separated, loaded at start by every
# process (runtime.tools.loading), with the entry points of the group ``agent_console.tools``.
TOOL_MODULES = [m.strip() for m in os.environ.get("TOOL_MODULES", "").split(",") if m.strip()]
# Tools declared without code (docs/tools.md): the keys sealing an HTTP tool's credential (first
# seals, all open; unset, derived from SECRET_KEY: runtime/keyring.py), and whether HTTP tools
# may reach addresses that are not globally routable (the webhooks' address guard applies).
TOOL_SECRET_KEYS = [
    k.strip() for k in os.environ.get("TOOL_SECRET_KEYS", "").split(",") if k.strip()
]
TOOL_ALLOW_PRIVATE_HOSTS = os.environ.get("TOOL_ALLOW_PRIVATE_HOSTS", "0") == "1"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# A container image collects static files at build time, outside the (mounted) data directory.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or DATA_DIR / "staticfiles")
# Outside production, serve static files straight from static/ (no collectstatic step).
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = not PRODUCTION
MEDIA_ROOT = DATA_DIR / "media"

if os.environ.get("S3_BUCKET"):
    _default_storage: dict[str, object] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": os.environ["S3_BUCKET"],
            "endpoint_url": os.environ.get("S3_ENDPOINT_URL") or None,
            "region_name": os.environ.get("S3_REGION") or None,
            "file_overwrite": False,
        },
    }
else:
    _default_storage = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(MEDIA_ROOT)},
    }
STORAGES = {
    "default": _default_storage,
    # Artifact bytes under their content address (runtime/artifact_store.py).
    "artifacts": _default_storage
    if os.environ.get("S3_BUCKET")
    else {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": os.environ.get("ARTIFACT_ROOT") or str(MEDIA_ROOT / "artifacts")},
    },
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Artifacts and completion checks.
ARTIFACT_MAX_BYTES = _env_int("ARTIFACT_MAX_BYTES", 100 * 1024 * 1024)
ARTIFACT_MEDIA_TYPES = [
    m.strip()
    for m in os.environ.get(
        "ARTIFACT_MEDIA_TYPES",
        "text/plain,text/markdown,text/csv,application/json,application/pdf,"
        "application/octet-stream,application/zip,application/gzip,"
        "image/png,image/jpeg,image/gif,image/webp",
    ).split(",")
    if m.strip()
]
# Never-accepted uploads of ended tasks, and stored bytes nothing references, are reclaimed
# after this long; uploads still staged after the grace are recovered or marked failed.
ARTIFACT_RETENTION_SECONDS = _env_int("ARTIFACT_RETENTION_SECONDS", 24 * 3600)
ARTIFACT_STAGING_GRACE_SECONDS = _env_int("ARTIFACT_STAGING_GRACE_SECONDS", 600)
ARTIFACT_RECONCILE_SECONDS = _env_int("ARTIFACT_RECONCILE_SECONDS", 300)
# An upload of bytes the reconciler is deleting waits this long for the deletion (one storage
# call) before answering 503; a deletion marked longer ago than the second one was abandoned by
# a reconciler that died, and the next reconciliation finishes it.
ARTIFACT_DELETION_WAIT_SECONDS = _env_int("ARTIFACT_DELETION_WAIT_SECONDS", 10)
ARTIFACT_DELETION_STALE_SECONDS = _env_int("ARTIFACT_DELETION_STALE_SECONDS", 600)
# Retention (runtime/retention.py, docs/operations.md#retention): ended tasks with all their
# rows are archived (JSON lines in the artifact storage) and removed RETENTION_TASK_DAYS after
# they last moved (0: kept for ever); Idempotency-Key records once IDEMPOTENCY_KEY_HOURS passed
# (their replay window; 0: kept for ever). Beat starts a run every RETENTION_SECONDS (0: never);
# a run removes at most RETENTION_BATCHES batches of RETENTION_BATCH tasks (or records).
RETENTION_TASK_DAYS = float(os.environ.get("RETENTION_TASK_DAYS") or 0)
IDEMPOTENCY_KEY_HOURS = float(os.environ.get("IDEMPOTENCY_KEY_HOURS") or 24)
RETENTION_SECONDS = _env_int("RETENTION_SECONDS", 3600)
RETENTION_BATCH = _env_int("RETENTION_BATCH", 200)
RETENTION_BATCHES = _env_int("RETENTION_BATCHES", 50)
CHECK_TIMEOUT_SECONDS = float(os.environ.get("CHECK_TIMEOUT_SECONDS") or 10.0)
CHECK_JSON_MAX_BYTES = _env_int("CHECK_JSON_MAX_BYTES", 16 * 1024 * 1024)
# Recorded in every artifact's provenance.
CODE_VERSION = os.environ.get("CODE_VERSION", "agent-console 0.1.0")
# The commit the code was built from, for /metrics' build info (console.metrics); when unset,
# read from the checkout's .git if there is one.
GIT_COMMIT = os.environ.get("GIT_COMMIT", "")

# Traces (console.tracing, docs/operations.md#traces): on with OTEL_ENABLED=1, or when the
# standard OTEL_* environment names a trace exporter or an OTLP endpoint; the SDK reads the rest.
OTEL_ENABLED = os.environ.get("OTEL_ENABLED", "0") == "1"

# Notifications (docs/notifications.md). Email through Django's email framework: SMTP when
# EMAIL_HOST is set (EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS,
# EMAIL_USE_SSL), else, so a newcomer sees them, files under DATA_DIR/mail.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = _env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("EMAIL_USE_TLS", "0") == "1"
EMAIL_USE_SSL = os.environ.get("EMAIL_USE_SSL", "0") == "1"
EMAIL_TIMEOUT = _env_int("EMAIL_TIMEOUT", 20)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "agent-console@localhost")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND") or (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.filebased.EmailBackend"
)
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH") or str(DATA_DIR / "mail")
# The console's address as people reach it: links in messages start with it.
CONSOLE_URL = os.environ.get("CONSOLE_URL", "http://localhost:8000").rstrip("/")
# A deployment-wide webhook (signed with NOTIFY_WEBHOOK_SECRET) and a Slack incoming webhook.
NOTIFY_WEBHOOK_URL = os.environ.get("NOTIFY_WEBHOOK_URL", "")
NOTIFY_WEBHOOK_SECRET = os.environ.get("NOTIFY_WEBHOOK_SECRET", "")
NOTIFY_SLACK_WEBHOOK_URL = os.environ.get("NOTIFY_SLACK_WEBHOOK_URL", "")
# Webhooks to addresses that are not globally routable are refused unless this is 1.
NOTIFY_ALLOW_PRIVATE_HOSTS = os.environ.get("NOTIFY_ALLOW_PRIVATE_HOSTS", "0") == "1"
# At most one message per person (or webhook), kind and channel in this many seconds; later
# ones are folded into the next (a digest).
NOTIFY_DIGEST_SECONDS = _env_int("NOTIFY_DIGEST_SECONDS", 60)
# An approval or a wait this close to its expiry gets a reminder (the sweeper).
NOTIFY_EXPIRY_WARNING_SECONDS = _env_int("NOTIFY_EXPIRY_WARNING_SECONDS", 600)
NOTIFY_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("NOTIFY_WEBHOOK_TIMEOUT_SECONDS") or 10.0)
# Keys sealing admin-configured webhook URLs and deriving their signing secrets (first seals,
# all open); unset, derived from SECRET_KEY (runtime/keyring.py).
NOTIFY_KEYS = [k.strip() for k in os.environ.get("NOTIFY_KEYS", "").split(",") if k.strip()]

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # The strict JSON parser refuses what PostgreSQL cannot store (NUL, lone surrogates,
    # infinities, runaway nesting) and duplicate keys with a 400; other media types are 415.
    # A view that takes a file upload declares the multipart parser itself.
    "DEFAULT_PARSER_CLASSES": ["console.api.parsers.JSONParser"],
    # DRF's test client sends multipart by default, which the API refuses (415).
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Agent execution console API",
    "DESCRIPTION": "Durable execution of agents' actions: tasks, operations, approvals, events.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    # Served from this site: the machine (and many deployments) cannot reach a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Ids in paths are what console.converters.IdConverter matches.
    "PATH_CONVERTER_OVERRIDES": {
        "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
    },
    # Same-valued enums share one component instead of a warning and a generated name.
    "ENUM_NAME_OVERRIDES": {
        "TaskCondition": "runtime.rules.statuses.TaskCondition.ALL",
        "TaskOutcome": "runtime.rules.statuses.TaskOutcome.ALL",
        "OperationStatus": "runtime.rules.statuses.OperationStatus.ALL",
        "Cancellation": "runtime.rules.statuses.Cancellation.ALL",
        # runtime.models.Operation.KINDS and the error kinds of CompleteIn (models cannot be
        # imported while settings load).
        "OperationKind": ["tool", "wait_signal", "timer"],
        "ErrorKind": ["transient", "permanent"],
        "ApprovalStatus": "runtime.rules.statuses.ApprovalStatus.ALL",
        # runtime.models.Signal.DISPOSITIONS
        "SignalDisposition": ["delivered", "buffered", "duplicate", "late"],
        # runtime.models.Operation.EXECUTORS (an operation's executor, a tool's executors) and
        # runtime.models.tools.DeclaredToolKind.ALL.
        "ExecutorEnum": ["worker", "agent"],
        "DeclaredToolKind": ["http", "agent"],
    },
    "ENUM_ADD_EXPLICIT_BLANK_NULL_CHOICE": False,
    # A string that may not be blank says so (minLength 1), requests and responses alike.
    "ENFORCE_NON_BLANK_FIELDS": True,
}

# LOG_FORMAT=json: one JSON object per line (console.logformat); otherwise human-readable lines.
# Either way a line about a piece of work carries its task, attempt, operation and execution ids.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").strip().lower()
LOGGING_CONFIG = "console.logformat.logging_configure"  # dictConfig, and warnings logged
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {
            "()": "console.logformat.PlainFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "console.logformat.json_formatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
    "loggers": {
        "runtime": {"level": os.environ.get("RUNTIME_LOG_LEVEL", "INFO")},
        # Django's default gives "django" a handler of its own (with DEBUG=1: a second, plain
        # line for each record); its records reach the root's handler like any other.
        "django": {"level": "INFO", "handlers": []},
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

if PRODUCTION:
    SECURE_SSL_REDIRECT = os.environ.get("SECURE_SSL_REDIRECT", "1") == "1"
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = _env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# Full origins (scheme://host[:port]) trusted for forms and websockets besides this server's own.
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]
