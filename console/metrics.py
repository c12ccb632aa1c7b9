"""Prometheus metrics at ``GET /metrics``.

Two sources, one page:

- the database, read when the scraper asks (``DatabaseCollector``, over
  ``runtime.selectors.metrics``): operations by status and tool, tasks, the due outbox (queue
  depth), pending approvals and their ages, live workers, and what workers and the sweeper did
  (lease takeovers, refused reports, rejected observations, budget refusals at dispatch), and
  the latency histograms (schedule to start, run time by tool, time to a person's decision:
  ``runtime.selectors.latencies``), from the journal's events that start and end each interval.
  The database is the one record every process writes, on every machine, so a worker needs no
  endpoint of its own, the hot path counts and times nothing, and every web process reports
  the same histograms (a histogram kept in each worker's memory would need every worker
  scraped, or prometheus_client's multiprocess files shared across machines);
- this web process (``RequestMetricsMiddleware``): request latency by route, method and HTTP
  status code, and the refusals it answered by error code (budget refusals at admission among
  them, which roll back and leave no row). With several web processes (``WEB_CONCURRENCY``)
  these are aggregated through prometheus_client's multiprocess mode: ``console.server`` gives
  its processes a shared ``PROMETHEUS_MULTIPROC_DIR``;
- the build (``agent_console_build_info``): the package's version and git commit.

Labels mean one thing on every metric: ``status`` an operation's status, ``code`` an HTTP
status code, ``error`` a contract error code, ``tool`` a tool's name.

Who may read it is ``runtime.policy_features.can_read_metrics``: the scraper presenting
``METRICS_TOKEN`` as its bearer token, or an admin (docs/security.md)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.metadata
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from rest_framework import exceptions
from rest_framework.request import Request

from console.api.auth import BearerTokenAuthentication
from console.api.errors import classify, error_body
from runtime.actors import Actor, actor_for_user
from runtime.errors import DomainError, NotAuthenticated
from runtime.executions import executions_live
from runtime.policy_features import METRICS_SCRAPER, can_read_metrics
from runtime.selectors import latencies
from runtime.selectors import metrics as sel

Handler = Callable[[HttpRequest], HttpResponse]

PREFIX = "agent_console"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Labels mean one thing on every metric: ``status`` an operation's status, ``code`` an HTTP
# status code, ``error`` a contract error code (docs/operations.md, Metrics).
REQUEST_SECONDS = Histogram(
    f"{PREFIX}_http_request_duration_seconds",
    "Time to answer an HTTP request (to the response's head for a stream), by route name, "
    "method and HTTP status code.",
    ["route", "method", "code"],
)
REFUSALS = Counter(
    f"{PREFIX}_api_refusals",
    "Requests refused with a contract error code (4xx and 5xx answers), by error code.",
    ["error"],
)
BUDGET_REFUSALS = Counter(
    f"{PREFIX}_budget_refusals",
    "Proposals and child tasks refused at admission because the budget cannot cover them "
    "(409 budget_exhausted; dispatch refusals: agent_console_budget_dispatch_refusals_total).",
    ["route"],
)


def _route(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    return str(match.url_name or match.route or "unnamed")


def _refusal_code(response: HttpResponse) -> str | None:
    data = getattr(response, "data", None)  # a DRF response keeps the body it rendered
    if response.status_code < 400 or not isinstance(data, dict):
        return None
    error = data.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


class RequestMetricsMiddleware:
    """First in the chain: every request's latency by route name (the URL conf's, bounded),
    method and HTTP status code; a refusal's error code. A few microseconds per request, no
    I/O."""

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        route = _route(request)
        method = request.method if request.method in _METHODS else "other"
        REQUEST_SECONDS.labels(route, method, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        code = _refusal_code(response)
        if code is not None:
            REFUSALS.labels(code).inc()
            if code == "budget_exhausted":
                BUDGET_REFUSALS.labels(route).inc()
        return response


class DatabaseCollector:
    """Reads the database at each scrape; a database that does not answer is reported (``up``
    0) rather than failing the scrape."""

    def __init__(self) -> None:
        self.journal = sel.journal_tally()
        self.rejections = sel.rejections_tally()
        self.budget_stops = sel.budget_stops_tally()
        self.schedule_to_start = latencies.schedule_to_start()
        self.run_time = latencies.run_time()
        self.decision_time = latencies.decision_time()

    def describe(self) -> Iterable[Metric]:
        return []  # no read at registration

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            families = list(self._families())
            up = 1.0
        except DatabaseError:
            families, up = [], 0.0
        yield from families
        yield GaugeMetricFamily(
            f"{PREFIX}_database_up", "Whether the database answered this scrape.", value=up
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_scrape_database_seconds",
            "Time the database reads of this scrape took.",
            value=time.perf_counter() - started,
        )

    def _families(self) -> Iterator[Metric]:
        now = timezone.now()
        ops = GaugeMetricFamily(
            f"{PREFIX}_operations",
            "Operations not yet settled, by status and tool.",
            labels=["status", "tool"],
        )
        for status, tool, n in sel.operations_in_flight():
            ops.add_metric([status, tool], n)
        yield ops
        settled = GaugeMetricFamily(
            f"{PREFIX}_operations_settled",
            "Settled operations (succeeded, failed, cancelled, compensated), by status.",
            labels=["status"],
        )
        for status, n in sel.operations_settled().items():
            settled.add_metric([status], n)
        yield settled
        tasks = GaugeMetricFamily(
            f"{PREFIX}_tasks", "Tasks by condition and outcome.", labels=["condition", "outcome"]
        )
        for condition, outcome, n in sel.tasks_by_condition():
            tasks.add_metric([condition, outcome or "none"], n)
        yield tasks
        due = GaugeMetricFamily(
            f"{PREFIX}_outbox_due",
            "Announced work due and not yet claimed (the queue's depth), by topic.",
            labels=["topic"],
        )
        for topic, n in sel.outbox_due(now).items():
            due.add_metric([topic], n)
        yield due
        yield GaugeMetricFamily(
            f"{PREFIX}_workers_live",
            "Worker processes whose heartbeat is recent.",
            value=executions_live(),
        )
        yield from self._approvals(now)
        yield from self._journal(now)
        yield from self._latencies(now)

    def _approvals(self, now: Any) -> Iterator[Metric]:
        pending = sel.approvals_pending(now)
        yield GaugeMetricFamily(
            f"{PREFIX}_approvals_pending", "Requests waiting for a person.", value=pending.count
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_approval_oldest_pending_seconds",
            "How long the oldest pending request has waited (0 when none).",
            value=pending.oldest_seconds,
        )
        bounds = [*(repr(b) for b in sel.APPROVAL_AGE_BUCKETS), "+Inf"]
        yield GaugeHistogramMetricFamily(
            f"{PREFIX}_approval_pending_age_seconds",
            "How long the pending requests have waited so far.",
            buckets=list(zip(bounds, pending.buckets, strict=True)),
            gsum_value=pending.total_seconds,
        )

    def _journal(self, now: Any) -> Iterator[Metric]:
        journal = self.journal.totals(now)
        yield CounterMetricFamily(
            f"{PREFIX}_lease_takeovers",
            "Running operations whose lease expired and the sweeper took back.",
            value=journal.get(sel.LEASE_TAKEOVERS, 0),
        )
        yield CounterMetricFamily(
            f"{PREFIX}_reports_rejected",
            "Reports refused as stale (an old lease generation reporting after a takeover).",
            value=journal.get(sel.REPORT_REJECTED, 0),
        )
        rejected = CounterMetricFamily(
            f"{PREFIX}_rejected_observations",
            "Observations refused and kept for diagnosis (stale reports, refused claims of "
            "duplicate deliveries...), by kind.",
            labels=["kind"],
        )
        for kind, n in sorted(self.rejections.totals(now).items()):
            rejected.add_metric([kind], n)
        yield rejected
        yield CounterMetricFamily(
            f"{PREFIX}_budget_dispatch_refusals",
            "Retries and re-dispatches the budget could not hold another call for.",
            value=sum(self.budget_stops.totals(now).values()),
        )

    def _latencies(self, now: Any) -> Iterator[Metric]:
        yield _histogram(
            f"{PREFIX}_operation_schedule_to_start_seconds",
            "Time from an operation's becoming due (proposed, approved, taken over, its retry's "
            "time) to its claim by a worker.",
            self.schedule_to_start.totals(now),
        )
        yield _histogram(
            f"{PREFIX}_operation_run_seconds",
            "Time from a claim to the acceptance of its report (succeeded, failed, retry "
            "scheduled, outcome unknown), by tool.",
            self.run_time.totals(now),
            "tool",
        )
        yield _histogram(
            f"{PREFIX}_approval_decision_seconds",
            "Time from an approval's request to a person's decision, by decision "
            "(approved, denied).",
            self.decision_time.totals(now),
            "decision",
        )


def _histogram(
    name: str, doc: str, series: dict[str, latencies.Buckets], label: str | None = None
) -> Metric:
    """A histogram family from the journal's buckets, one series per label value (one series,
    unlabelled, when ``label`` is None)."""
    family = HistogramMetricFamily(name, doc, labels=[label] if label else [])
    for value, buckets in series.items():
        bounds = [*(repr(b) for b in buckets.bounds), "+Inf"]
        family.add_metric(
            [value] if label else [],
            buckets=list(zip(bounds, buckets.cumulative(), strict=True)),
            sum_value=buckets.total,
        )
    return family


def build_info() -> Metric:
    """``agent_console_build_info{version,commit} 1``: the package's version and the commit it
    was built from (``GIT_COMMIT``, else read from the checkout's ``.git``; "unknown")."""
    family = GaugeMetricFamily(
        f"{PREFIX}_build_info",
        "The running code: the package's version and the git commit it was built from.",
        labels=["version", "commit"],
    )
    family.add_metric([_version(), _commit()], 1)
    return family


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("agent-console")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _commit() -> str:
    return str(settings.GIT_COMMIT or "") or git_commit(Path(settings.BASE_DIR)) or "unknown"


def git_commit(root: Path) -> str:
    """The commit checked out at ``root``, read from its git files (a worktree's ``.git`` file
    and packed refs included), or "" when there is none to read (an image without ``.git``)."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree's: "gitdir: <its directory>"
            git = Path(git.read_text().partition(":")[2].strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head  # detached
        ref = head.removeprefix("ref: ")
        common = git / "commondir"
        bases = [git, (git / common.read_text().strip()).resolve()] if common.is_file() else [git]
        for base in bases:
            if (base / ref).is_file():
                return (base / ref).read_text().strip()
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(f" {ref}"):
                        return line.split(" ", 1)[0]
    except OSError:
        pass
    return ""


class BuildInfoCollector:
    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield build_info()


_DATABASE = CollectorRegistry(auto_describe=False)
_DATABASE.register(DatabaseCollector())
_DATABASE.register(BuildInfoCollector())


def _process_registry() -> CollectorRegistry:
    """This process's metrics, or every web process's when they share a multiprocess dir."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def exposition() -> bytes:
    return generate_latest(_process_registry()) + generate_latest(_DATABASE)


# The scraper's principal: the holder of METRICS_TOKEN (runtime.policy_features.can_read_metrics).
def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def _scraper_token(request: HttpRequest) -> bool:
    configured = str(getattr(settings, "METRICS_TOKEN", "") or "")
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if not configured or scheme.lower() != "bearer" or not given.strip():
        return False
    return hmac.compare_digest(_digest(given.strip()), _digest(configured))


def _principal(request: HttpRequest) -> Actor:
    """The METRICS_TOKEN holder, an API token's actor (the API's check and rate limit), or the
    signed-in person; NotAuthenticated for nobody."""
    if _scraper_token(request):
        return METRICS_SCRAPER
    try:
        found = BearerTokenAuthentication().authenticate(Request(request))
    except exceptions.AuthenticationFailed as exc:
        raise NotAuthenticated(str(exc.detail)) from None
    if found is not None:
        return found[1]
    user = request.user
    if user.is_authenticated:
        return actor_for_user(int(str(user.pk)), user.get_username())
    raise NotAuthenticated("a bearer token (METRICS_TOKEN, or an admin's) or an admin's session")


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        can_read_metrics(_principal(request))
    except DomainError as exc:
        status, code, message = classify(exc) or (403, "not_authorized", "not authorized")
        response = JsonResponse(error_body(code, message), status=status)
        if status == 401:
            response["WWW-Authenticate"] = "Bearer"
        retry = getattr(exc, "retry_after", None)
        if retry:
            response["Retry-After"] = str(retry)
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
