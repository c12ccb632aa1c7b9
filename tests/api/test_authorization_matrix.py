# ruff: noqa: E501 (the matrix is a table: one row per line)
"""The authorization matrix: every route of the URL conf and every websocket route, for every
kind of caller, with the status it gets; on a refusal, nothing changed. The routes are walked
from the URL conf and the websocket routing, so a route added without a row here fails
``test_every_route_has_a_row`` by name. docs/security.md shows the same table
(tests/api/test_security_doc.py keeps them equal).

Cells: an HTTP status; ``LOGIN`` a redirect to the login page (console pages know only
sessions, so a bearer token there is nobody); ``OPEN`` a websocket that stays open; 44xx the
close code a refused websocket gets.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.db.models import Sum
from django.test.utils import override_settings
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from console.web.routing import websocket_urlpatterns
from runtime.models import (
    ApiToken,
    Approval,
    Attempt,
    AuditRecord,
    Claim,
    DeclaredTool,
    DeclaredToolVersion,
    Event,
    Invocation,
    Operation,
    Resolution,
    Schedule,
    ScheduleEvent,
    ScheduleRun,
    Signal,
    Task,
    TaskCommand,
)
from runtime.sandbox import receivers
from runtime.schedules.services import schedule_create
from runtime.schedules.specs import ScheduleSpec
from runtime.tasks import TaskSpec
from runtime.tokens import token_issue_for_agent
from runtime.tool_declarations import tool_declare
from runtime.tools.declared import declarations_forget
from runtime.waits import wait_sweep
from tests import factories

pytestmark = [pytest.mark.postgres]

LOGIN = "login"
OPEN = "open"

PRINCIPALS = (
    "anonymous",
    "owner_agent",
    "other_agent",
    "operator",
    "support",
    "admin",
    "operator_token",
    "support_token",
    "admin_token",
)

# method, route (as the URL conf spells it) -> one cell per principal, in PRINCIPALS' order:
#                    anon   owner  other  oper   supp   admin  oper_t supp_t admin_t
MATRIX: dict[tuple[str, str], tuple[Any, ...]] = {
    ("GET", "healthz"): (200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "api/schema/"): (200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "api/docs/"): (200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "api/v1/tasks"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/tasks"): (401, 201, 201, 201, 201, 201, 201, 201, 201),
    ("GET", "api/v1/tasks/<id:task_id>"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("GET", "api/v1/tasks/<id:task_id>/operations"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/tasks/<id:task_id>/operations"): (401, 201, 404, 403, 403, 403, 403, 403, 403),
    ("GET", "api/v1/tasks/<id:task_id>/events"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("GET", "api/v1/operations"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "api/v1/operations/<id:operation_id>"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/operations/<id:operation_id>/claim"): (401, 200, 404, 403, 403, 403, 403, 403, 403),
    ("POST", "api/v1/operations/<id:operation_id>/heartbeat"): (401, 409, 404, 403, 403, 403, 403, 403, 403),
    ("POST", "api/v1/operations/<id:operation_id>/complete"): (401, 409, 404, 403, 403, 403, 403, 403, 403),
    ("POST", "api/v1/tasks/<id:task_id>/cancel"): (401, 202, 404, 403, 403, 202, 403, 403, 202),
    ("POST", "api/v1/tasks/<id:task_id>/fail"): (401, 202, 404, 403, 403, 202, 403, 403, 202),
    ("GET", "api/v1/queues/<str:queue>/items/<id:operation_id>"): (401, 403, 403, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/queues/<str:queue>/items/<id:operation_id>/take"): (401, 403, 403, 403, 409, 409, 403, 409, 409),
    ("POST", "api/v1/queues/<str:queue>/items/<id:operation_id>/give"): (401, 403, 403, 403, 400, 400, 403, 400, 400),
    ("POST", "api/v1/queues/<str:queue>/items/<id:operation_id>/release"): (401, 403, 403, 403, 409, 409, 403, 409, 409),
    ("POST", "api/v1/queues/<str:queue>/items/<id:operation_id>/comments"): (401, 403, 403, 403, 201, 201, 403, 201, 201),
    ("POST", "api/v1/operations/<id:operation_id>/resolve"): (401, 403, 403, 403, 200, 200, 403, 200, 200),
    ("GET", "api/v1/demo/receivers/<id:receiver>/effects"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    # Outcomes (issue 12). The artifact rows name an artifact that does not exist, and the upload
    # and accept rows send no multipart body / no version: they pin that refusals come before
    # anything is revealed; the allowed paths are covered in tests/api/test_outcomes_api.py.
    ("POST", "api/v1/tasks/<id:task_id>/complete"): (401, 409, 404, 403, 403, 409, 403, 403, 409),
    ("GET", "api/v1/tasks/<id:task_id>/checks"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/tasks/<id:task_id>/checks"): (401, 200, 404, 403, 403, 200, 403, 403, 200),
    ("GET", "api/v1/tasks/<id:task_id>/artifacts"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/tasks/<id:task_id>/artifacts"): (401, 415, 415, 415, 415, 415, 415, 415, 415),
    ("GET", "api/v1/artifacts/<id:artifact_id>"): (401, 404, 404, 404, 404, 404, 404, 404, 404),
    ("POST", "api/v1/artifacts/<id:artifact_id>/accept"): (401, 400, 400, 400, 400, 400, 400, 400, 400),
    ("GET", "api/v1/artifacts/<id:artifact_id>/content"): (401, 404, 404, 404, 404, 404, 404, 404, 404),
    ("GET", "api/v1/artifacts/<id:artifact_id>/provenance"): (401, 404, 404, 404, 404, 404, 404, 404, 404),
    ("GET", "tasks/<id:task_id>/outcomes"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    # Limits (issue 11): a new attempt is the task's agent's or an admin's; the budget is read
    # by whoever sees the task.
    ("POST", "api/v1/tasks/<id:task_id>/attempts"): (401, 201, 404, 403, 403, 201, 403, 403, 201),
    ("GET", "api/v1/tasks/<id:task_id>/budget"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    # People in the loop (issue 10). The approval is a pending one the owner's agent requested
    # (a gated charge); the wait routes act on an expired signal wait of the owner's task.
    ("GET", "api/v1/approvals"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/approvals/decisions"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "api/v1/approvals/<id:approval_id>"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/approvals/<id:approval_id>/decision"): (401, 403, 404, 200, 403, 200, 200, 403, 200),
    ("POST", "api/v1/approvals/<id:approval_id>/edit"): (401, 403, 404, 201, 403, 201, 201, 403, 201),
    ("POST", "api/v1/approvals/<id:approval_id>/renew"): (401, 403, 404, 403, 403, 409, 403, 403, 409),
    ("GET", "api/v1/tasks/<id:task_id>/signals"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/tasks/<id:task_id>/signals"): (401, 202, 404, 403, 403, 403, 403, 403, 403),
    ("POST", "api/v1/tasks/<id:task_id>/pause"): (401, 202, 404, 202, 403, 202, 202, 403, 202),
    ("POST", "api/v1/tasks/<id:task_id>/resume"): (401, 202, 404, 202, 403, 202, 202, 403, 202),
    ("POST", "api/v1/tasks/<id:task_id>/steer"): (401, 202, 404, 202, 403, 202, 202, 403, 202),
    ("GET", "api/v1/waits"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/waits/<id:operation_id>/renew"): (401, 403, 404, 403, 403, 200, 403, 403, 200),
    ("POST", "api/v1/waits/<id:operation_id>/transform"): (401, 403, 404, 403, 403, 200, 403, 403, 200),
    ("POST", "api/v1/waits/<id:operation_id>/end"): (401, 403, 404, 403, 403, 202, 403, 403, 202),
    ("GET", "approvals/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "fragments/approvals"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "approvals/bulk"): (LOGIN, LOGIN, LOGIN, 302, 302, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "approvals/<id:approval_id>/decide"): (LOGIN, LOGIN, LOGIN, 302, 403, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "approvals/<id:approval_id>/edit"): (LOGIN, LOGIN, LOGIN, 302, 403, 302, LOGIN, LOGIN, LOGIN),
    ("GET", "waits/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "fragments/waits"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "waits/<id:operation_id>/act"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "tasks/<id:task_id>/control"): (LOGIN, LOGIN, LOGIN, 302, 403, 302, LOGIN, LOGIN, LOGIN),
    ("GET", "login/"): (200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("POST", "login/"): (200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("POST", "logout/"): (302, 302, 302, 302, 302, 302, 302, 302, 302),
    ("GET", "logout/"): (200, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", ""): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "fragments/dashboard"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "tasks/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "fragments/tasks"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "tasks/<id:task_id>/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "tasks/<id:task_id>/cancel"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "tasks/<id:task_id>/attempt"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    # Saved views (issue 39): each person's own; removing another's (or none) is a 404.
    ("POST", "tasks/views"): (LOGIN, LOGIN, LOGIN, 302, 302, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "tasks/views/<int:view_id>/remove"): (LOGIN, LOGIN, LOGIN, 404, 404, 404, LOGIN, LOGIN, LOGIN),
    ("GET", "tasks/<id:task_id>/live"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "tokens/"): (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "tokens/"): (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "tokens/<id:token_id>/revoke"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("GET", "unresolved/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "fragments/unresolved"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "unresolved/<id:operation_id>/resolve"): (LOGIN, LOGIN, LOGIN, 403, 302, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "unresolved/bulk"): (LOGIN, LOGIN, LOGIN, 403, 302, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "work/<str:queue>/<id:operation_id>"): (LOGIN, LOGIN, LOGIN, 403, 302, 302, LOGIN, LOGIN, LOGIN),
    # Finding things (issue 24): the tool catalogue for every authenticated caller; an
    # operation's page and the catalogue's page for every console role.
    ("GET", "api/v1/tools"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("GET", "operations/<id:operation_id>/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "tools/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    # Operability (issue 25): the metrics for the METRICS_TOKEN holder (tests/api/test_metrics.py)
    # and admins; the read-only admin for admins (its inner routes: tests/console/test_admin.py).
    ("GET", "metrics"): (401, 403, 403, 403, 403, 200, 403, 403, 200),
    ("GET", "admin/"): (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    # Schedules (issue 26): agents own theirs, admins manage all, every console role reads.
    ("GET", "api/v1/schedules"): (401, 200, 200, 200, 200, 200, 200, 200, 200),
    ("POST", "api/v1/schedules"): (401, 201, 201, 403, 403, 201, 403, 403, 201),
    ("GET", "api/v1/schedules/<id:schedule_id>"): (401, 200, 404, 200, 200, 200, 200, 200, 200),
    ("PATCH", "api/v1/schedules/<id:schedule_id>"): (401, 200, 404, 403, 403, 200, 403, 403, 200),
    ("POST", "api/v1/schedules/<id:schedule_id>/pause"): (401, 200, 404, 403, 403, 200, 403, 403, 200),
    ("POST", "api/v1/schedules/<id:schedule_id>/resume"): (401, 200, 404, 403, 403, 200, 403, 403, 200),
    ("POST", "api/v1/schedules/<id:schedule_id>/trigger"): (401, 201, 404, 403, 403, 201, 403, 403, 201),
    ("GET", "schedules/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "schedules/<id:schedule_id>/act"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "schedules/<id:schedule_id>/edit"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "schedules/new"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    # Notifications (issue 26): each person their own settings and deliveries; admins the
    # webhooks (the remove row names no endpoint: refused before anything is revealed).
    ("POST", "tasks/<id:task_id>/watch"): (LOGIN, LOGIN, LOGIN, 302, 302, 302, LOGIN, LOGIN, LOGIN),
    ("GET", "notifications/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("GET", "settings/notifications/"): (LOGIN, LOGIN, LOGIN, 200, 200, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "settings/notifications/"): (LOGIN, LOGIN, LOGIN, 302, 302, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "settings/notifications/endpoints"): (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "settings/notifications/endpoints/<id:endpoint_id>/remove"): (LOGIN, LOGIN, LOGIN, 403, 403, 404, LOGIN, LOGIN, LOGIN),
    ("POST", "settings/notifications/test"): (LOGIN, LOGIN, LOGIN, 302, 302, 302, LOGIN, LOGIN, LOGIN),
    ("POST", "settings/notifications/endpoints/<id:endpoint_id>/test"): (LOGIN, LOGIN, LOGIN, 403, 403, 404, LOGIN, LOGIN, LOGIN),
    # Tools declared without code (issue 36): admins declare, edit and read the declarations;
    # the catalogue (above) stays every caller's.
    ("GET", "api/v1/tools/declared"): (401, 403, 403, 403, 403, 200, 403, 403, 200),
    ("POST", "api/v1/tools/declared"): (401, 403, 403, 403, 403, 201, 403, 403, 201),
    ("GET", "api/v1/tools/declared/<name>"): (401, 403, 403, 403, 403, 200, 403, 403, 200),
    ("PATCH", "api/v1/tools/declared/<name>"): (401, 403, 403, 403, 403, 200, 403, 403, 200),
    ("POST", "tools/declared"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("GET", "tools/declared/<name>/"): (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    ("POST", "tools/declared/<name>/edit"): (LOGIN, LOGIN, LOGIN, 403, 403, 302, LOGIN, LOGIN, LOGIN),
    ("WS", "ws/tasks/<id:task_id>/"): (4401, 4401, 4401, OPEN, OPEN, OPEN, 4401, 4401, 4401),
    ("WS", "ws/feed/"): (4401, 4401, 4401, OPEN, OPEN, OPEN, 4401, 4401, 4401),
    # Presence (issue 39): on the queue's page, for those who work it (here the unresolved one).
    ("WS", "ws/presence/<str:queue>/"): (4401, 4401, 4401, 4403, OPEN, OPEN, 4401, 4401, 4401),
}  # fmt: skip

# Minting on /tokens/, by target (POST /tokens/ above mints for a new agent): a token acts only
# as its minter, as a new agent, or as an agent that holds one (rotation: kind=rotate), never
# as another person, and never as an existing agent through the new agent's form.
MINTS: dict[str, tuple[Any, ...]] = {
    "themself": (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    "other_user": (LOGIN, LOGIN, LOGIN, 403, 403, 403, LOGIN, LOGIN, LOGIN),
    "existing_agent": (LOGIN, LOGIN, LOGIN, 403, 403, 403, LOGIN, LOGIN, LOGIN),
    "rotate_agent": (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
    "new_agent": (LOGIN, LOGIN, LOGIN, 403, 403, 200, LOGIN, LOGIN, LOGIN),
}  # fmt: skip

# What each request carries (the minimum a caller with the right needs to succeed).
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "api/v1/tasks"): {"name": "matrix"},
    ("POST", "api/v1/tasks/<id:task_id>/operations"): {"tool": "demo.echo", "step": "matrix"},
    ("POST", "api/v1/operations/<id:operation_id>/heartbeat"): {
        "lease_generation": 1,
        "lease_token": "not-the-claims-token",
    },
    ("POST", "api/v1/operations/<id:operation_id>/complete"): {
        "lease_generation": 1,
        "lease_token": "not-the-claims-token",
        "outcome": "succeeded",
    },
    ("POST", "api/v1/tasks/<id:task_id>/cancel"): {"reason": "matrix"},
    ("POST", "api/v1/tasks/<id:task_id>/fail"): {"reason": "matrix"},
    ("POST", "api/v1/tasks/<id:task_id>/attempts"): {"reason": "matrix"},
    ("POST", "api/v1/operations/<id:operation_id>/resolve"): {
        "resolution": "no_effect",
        "evidence": "matrix",
    },
    ("POST", "login/"): {"username": "nobody", "password": "wrong-password"},
    ("POST", "tasks/<id:task_id>/cancel"): {"reason": "matrix"},
    ("POST", "tasks/<id:task_id>/attempt"): {"reason": "matrix"},
    ("POST", "tasks/views"): {"name": "matrix", "query": "outcome=failed"},
    ("POST", "tokens/"): {"kind": "agent", "subject": "matrix-agent"},
    ("POST", "unresolved/<id:operation_id>/resolve"): {
        "resolution": "no_effect",
        "evidence": "matrix",
    },
    # An item of the support queue (the agent-run operation, which does not wait there: a take
    # or release is refused with 409 once the right is checked, a hand-over to nobody with 400).
    ("POST", "api/v1/queues/<str:queue>/items/<id:operation_id>/give"): {"to": "nobody-here"},
    ("POST", "api/v1/queues/<str:queue>/items/<id:operation_id>/comments"): {"text": "matrix"},
    # A comment on an item of the support queue (a take would be refused while it is settled).
    ("POST", "work/<str:queue>/<id:operation_id>"): {"action": "comment", "text": "matrix"},
    ("POST", "api/v1/approvals/<id:approval_id>/decision"): {
        "decision": "deny",
        "reason": "matrix",
    },
    ("POST", "api/v1/approvals/<id:approval_id>/edit"): {
        "params": {"account": "a", "amount_cents": 30000},
        "reason": "matrix",
    },
    ("POST", "api/v1/approvals/<id:approval_id>/renew"): {"expires_in_seconds": 60},
    ("POST", "api/v1/tasks/<id:task_id>/signals"): {"event_id": "matrix-1", "name": "go"},
    ("POST", "api/v1/tasks/<id:task_id>/pause"): {"reason": "matrix"},
    ("POST", "api/v1/tasks/<id:task_id>/resume"): {"reason": "matrix"},
    ("POST", "api/v1/tasks/<id:task_id>/steer"): {"direction": "matrix"},
    ("POST", "api/v1/waits/<id:operation_id>/renew"): {"expires_in_seconds": 60},
    ("POST", "api/v1/waits/<id:operation_id>/transform"): {"reason": "matrix"},
    ("POST", "api/v1/waits/<id:operation_id>/end"): {"reason": "matrix"},
    ("POST", "approvals/<id:approval_id>/decide"): {"decision": "deny", "reason": "matrix"},
    ("POST", "approvals/<id:approval_id>/edit"): {
        "params": '{"account": "a", "amount_cents": 30000}',
        "reason": "matrix",
    },
    ("POST", "waits/<id:operation_id>/act"): {"action": "renew", "expires_in_seconds": "60"},
    ("POST", "tasks/<id:task_id>/control"): {"action": "pause", "reason": "matrix"},
    ("POST", "api/v1/schedules"): {"interval_seconds": 3600, "task": {"name": "matrix"}},
    ("PATCH", "api/v1/schedules/<id:schedule_id>"): {"overlap": "allow"},
    ("POST", "tasks/<id:task_id>/watch"): {"watch": "1"},
    ("POST", "settings/notifications/"): {"email_enabled": "1", "timezone": "UTC"},
    ("POST", "settings/notifications/endpoints"): {
        "name": "matrix",
        "url": "https://hooks.example.test/matrix",
        "format": "webhook",
    },
    ("POST", "schedules/<id:schedule_id>/act"): {"action": "pause"},
    ("POST", "api/v1/tools/declared"): {"name": "matrix.api", "kind": "agent", "contract": "none"},
    ("PATCH", "api/v1/tools/declared/<name>"): {"description": "matrix"},
    ("POST", "tools/declared"): {"name": "matrix.form", "kind": "agent", "contract": "none"},
    ("POST", "tools/declared/<name>/edit"): {"description": "matrix", "offered": "1"},
    ("POST", "schedules/new"): {
        "interval_seconds": "3600",
        "timezone": "UTC",
        "overlap": "allow",
        "catch_up_seconds": "60",
        "name": "matrix-new",
    },
    ("POST", "schedules/<id:schedule_id>/edit"): {
        "interval_seconds": "3600",
        "timezone": "UTC",
        "overlap": "allow",
        "catch_up_seconds": "60",
        "name": "matrix",
    },
}
# Routes whose operation is the unresolved one (the others act on the agent-run one).
ON_UNRESOLVED = {"resolve"}


def _walk(patterns: list[Any], prefix: str = "") -> list[str]:
    routes = []
    for p in patterns:
        if isinstance(p, URLResolver):
            routes += _walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            routes.append(prefix + str(p.pattern))
    return routes


def test_every_route_has_a_row():
    # The admin's own routes (one per model and view) stand behind its index's gate, which
    # tests/console/test_admin.py walks for every model: the index is the row here.
    http = {
        r for r in _walk(get_resolver().url_patterns) if r == "admin/" or not r.startswith("admin/")
    }
    ws = {str(p.pattern) for p in websocket_urlpatterns}
    covered = {route for _, route in MATRIX}
    missing = sorted((http | ws) - covered)
    assert not missing, (
        "routes missing from the authorization matrix (add a row per method to MATRIX in "
        f"tests/api/test_authorization_matrix.py and to docs/security.md): {missing}"
    )
    stale = sorted(covered - http - ws)
    assert not stale, f"rows for routes that no longer exist: {stale}"
    for key, cells in MATRIX.items():
        assert len(cells) == len(PRINCIPALS), key


@dataclass
class World:
    principals: dict[str, factories.Principal | None]
    task: Task
    agent_op: Operation
    unresolved_op: Operation
    approval: Approval
    expired_wait: Operation
    effect_key: str
    token_id: str
    schedule: Schedule
    declared: str


def _world_build() -> World:
    declarations_forget()  # this process's view of the declared tools: the world's
    owner, other = factories.agent(), factories.agent()
    people = {role: factories.console_user(role) for role in ("operator", "support", "admin")}
    declared = tool_declare(
        people["admin"].actor, {"name": "matrix.declared", "kind": "agent", "contract": "none"}
    )
    task = factories.task(owner, budget={"cost_cents": 100})
    agent_op = factories.operation(owner, task, step="think", executor="agent")
    unresolved_op = factories.operation(
        owner, task, step="tell", tool="demo.notify", params={"to": "x@example.com"}
    )
    Operation.objects.filter(pk=unresolved_op.pk).update(status="unresolved")
    unresolved_op.refresh_from_db()
    charge = factories.operation(
        owner, task, step="pay", tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 5},
    )  # fmt: skip
    receivers.payments_charge(key=charge.idempotency_key, body=charge.params, fencing_token=1)
    gated = factories.operation(
        owner, task, step="pay big", tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 25000},
    )  # fmt: skip
    expired_wait = factories.operation(
        owner, task, step="await go", kind="wait_signal", tool="", signal="go", timeout_seconds=60
    )
    Operation.objects.filter(pk=expired_wait.pk).update(wait_until=timezone.now())
    assert wait_sweep()["waits_expired"] == 1
    expired_wait.refresh_from_db()
    return World(
        principals={
            "anonymous": None,
            "owner_agent": owner,
            "other_agent": other,
            **{role: people[role] for role in people},
            **{f"{role}_token": people[role] for role in people},
        },
        task=task,
        agent_op=agent_op,
        unresolved_op=unresolved_op,
        approval=gated.approvals.get(),
        expired_wait=expired_wait,
        effect_key=charge.idempotency_key,
        token_id=token_issue_for_agent("matrix-victim").token.pk,
        schedule=schedule_create(
            owner.actor, ScheduleSpec(task=TaskSpec(name="matrix"), interval_seconds=3600)
        ),
        declared=declared.row.tool_id,
    )


# Passwords are hashed for every console user; the fast hasher keeps the world quick to build.
_FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="class")
def shared_world(django_db_setup: Any, django_db_blocker: Any) -> Iterator[World]:
    """One world for every HTTP cell, built once inside an outer transaction that is rolled
    back at the end (as Django's setUpTestData does): each cell runs in a savepoint of it, so
    whatever a cell's request changes is undone before the next cell, and ~600 cells do not
    each rebuild five principals, a task and its operations."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=_FAST_HASHER):
        outer = transaction.atomic()
        # The test's own transaction, as Django's setUpTestData marks it: entries that open a
        # durable transaction of their own (operation_propose) treat it as none.
        outer._from_testcase = True  # type: ignore[attr-defined]
        outer.__enter__()
        built = _world_build()
    yield built
    with django_db_blocker.unblock():
        transaction.set_rollback(True)
        outer.__exit__(None, None, None)
    declarations_forget()


@pytest.fixture
def world(transactional_db: Any) -> World:
    """A committed world, for cells whose requests run on other connections (websockets)."""
    with override_settings(PASSWORD_HASHERS=_FAST_HASHER):
        return _world_build()


def _snapshot() -> tuple[Any, ...]:
    """Everything a request could change, summarised: any write moves one of these."""
    return (
        Task.objects.count(),
        Task.objects.aggregate(v=Sum("state_version"))["v"],
        Operation.objects.count(),
        Operation.objects.aggregate(v=Sum("state_version"))["v"],
        Event.objects.count(),
        Invocation.objects.count(),
        Resolution.objects.count(),
        AuditRecord.objects.count(),
        ApiToken.objects.filter(revoked_at__isnull=False).count(),
        ApiToken.objects.count(),
        Attempt.objects.count(),
        Approval.objects.count(),
        Approval.objects.aggregate(v=Sum("state_version"))["v"],
        Signal.objects.count(),
        TaskCommand.objects.count(),
        Schedule.objects.count(),
        Schedule.objects.aggregate(v=Sum("version"))["v"],
        Schedule.objects.filter(paused=True).count(),
        ScheduleRun.objects.count(),
        ScheduleEvent.objects.count(),
        DeclaredTool.objects.count(),
        DeclaredToolVersion.objects.count(),
        Claim.objects.count(),
    )


def _path(route: str, w: World) -> str:
    if route.startswith(("api/v1/waits/", "waits/")):
        op = w.expired_wait
    elif route.rsplit("/", 1)[-1] in ON_UNRESOLVED:
        op = w.unresolved_op
    else:
        op = w.agent_op
    values = {
        "task_id": w.task.pk,
        "operation_id": op.pk,
        "receiver": "payments",
        "token_id": w.token_id,
        "approval_id": w.approval.pk,
        "artifact_id": "art_matrix",
        "schedule_id": w.schedule.pk,
        "endpoint_id": "nep_matrix",
        "view_id": "999999",
        "name": w.declared,
        "queue": "unresolved",
    }
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], route)


def _client(name: str, w: World) -> APIClient:
    client = APIClient()
    principal = w.principals[name]
    if principal is None:
        return client
    if principal.actor.kind == "user" and not name.endswith("_token"):
        client.force_login(principal.actor_user())
    else:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {principal.token}")
    return client


def _http_cells() -> list[Any]:
    return [
        pytest.param(method, route, name, cells[i], id=f"{method} /{route} as {name}")
        for (method, route), cells in MATRIX.items()
        if method != "WS"
        for i, name in enumerate(PRINCIPALS)
    ]


def _is_refusal(expected: Any) -> bool:
    return expected == LOGIN or (isinstance(expected, int) and expected in (401, 403, 404))


class TestHttpCells:
    """The HTTP cells share one world (``shared_world``, torn down with this class, before the
    websocket cells, which need a committed world of their own)."""

    @pytest.mark.django_db
    @pytest.mark.parametrize(("method", "route", "principal", "expected"), _http_cells())
    def test_http_cell(self, shared_world, method, route, principal, expected):
        world = shared_world
        client = _client(principal, world)
        path = _path(route, world)
        body = dict(BODIES.get((method, route), {}))
        if "resolve" in route:
            body["state_version"] = world.unresolved_op.state_version
        if route == "api/v1/approvals/decisions":
            item = {"approval": world.approval.pk, "decision": "deny", "reason": "matrix"}
            body = {"decisions": [item]}
        if route == "unresolved/bulk":
            op = world.unresolved_op
            body = {"resolution": "no_effect", "evidence": "matrix", "selected": f"{op.pk}|1"}
        if route == "approvals/bulk":
            body = {"decision": "deny", "reason": "matrix", "selected": world.approval.pk + "|"}
        before = _snapshot()
        if method == "GET":
            params = {"key": world.effect_key} if "effects" in route else {}
            response = client.get(path, params)
        elif method == "PATCH":
            response = client.patch(path, body, format="json")
        elif route.startswith("api/"):
            response = client.post(path, body, format="json")
        else:
            response = client.post(path, body, format="multipart")  # a console form
        if expected == LOGIN:
            assert response.status_code == 302, (response.status_code, response.content[:300])
            assert response["Location"].startswith("/login/")
        else:
            assert response.status_code == expected, (response.status_code, response.content[:300])
            if route.startswith("api/v1/") and response.status_code >= 400:
                assert set(response.json()) == {"error"}
        if _is_refusal(expected):
            assert _snapshot() == before, "a refused request changed something"


def _mint_subject(target: str, principal: str, w: World) -> tuple[str, str]:
    """The form's (kind, subject) for minting ``target`` as ``principal``."""
    me = w.principals[principal]
    mine = me.actor.name if me is not None and me.actor.kind == "user" else "nobody"
    if target == "themself":
        return "user", mine
    if target == "other_user":
        other = "admin" if mine != w.principals["admin"].actor.name else "operator"
        return "user", w.principals[other].actor.name
    if target == "existing_agent":
        return "agent", w.principals["owner_agent"].actor.name
    if target == "rotate_agent":
        return "rotate", w.principals["owner_agent"].actor.agent_id
    return "agent", "matrix-new-agent"


def _mint_cells() -> list[Any]:
    return [
        pytest.param(target, name, cells[i], id=f"mint for {target} as {name}")
        for target, cells in MINTS.items()
        for i, name in enumerate(PRINCIPALS)
    ]


class TestMintCells:
    @pytest.mark.django_db
    @pytest.mark.parametrize(("target", "principal", "expected"), _mint_cells())
    def test_mint_cell(self, shared_world, target, principal, expected):
        kind, subject = _mint_subject(target, principal, shared_world)
        client = _client(principal, shared_world)
        before = _snapshot()
        response = client.post(
            "/tokens/", {"kind": kind, "subject": subject, "name": "m"}, format="multipart"
        )
        if expected == LOGIN:
            assert response.status_code == 302 and response["Location"].startswith("/login/")
        else:
            assert response.status_code == expected, (response.status_code, response.content[:300])
        if _is_refusal(expected):
            assert _snapshot() == before, "a refused mint changed something"
        else:
            minted = ApiToken.objects.get(name="m")
            assert minted.minted_by == shared_world.principals[principal].actor.key


def _ws_cells() -> list[Any]:
    return [
        pytest.param(route, name, cells[i], id=f"WS /{route} as {name}")
        for (method, route), cells in MATRIX.items()
        if method == "WS"
        for i, name in enumerate(PRINCIPALS)
    ]


@pytest.mark.parametrize(("route", "principal", "expected"), _ws_cells())
def test_websocket_cell(world, route, principal, expected):
    from console.asgi import application

    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")]
    p = world.principals[principal]
    if p is not None and p.actor.kind == "user" and not principal.endswith("_token"):
        client = APIClient()
        client.force_login(p.actor_user())
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    elif p is not None:
        headers.append((b"authorization", f"Bearer {p.token}".encode()))
    before = _snapshot()

    async def attempt() -> Any:
        comm = WebsocketCommunicator(application, _path(route, world), headers=headers)
        try:
            connected, code = await comm.connect(timeout=10)
            if not connected:
                return code
            if await comm.receive_nothing(timeout=0.5):
                return OPEN  # a quiet feed: open, nothing to say yet
            message = await comm.receive_output(timeout=10)
            if message["type"] == "websocket.close":
                return message.get("code")
            return OPEN
        finally:
            await comm.disconnect()

    assert async_to_sync(attempt)() == expected
    if expected != OPEN:
        assert _snapshot() == before
