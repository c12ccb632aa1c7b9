"""``GET /metrics``: who may read it, and that its figures move with the work: an operation run by
real workers behind the real server, a takeover and a stale report, a budget refusal, and the
journal counted incrementally without counting a row twice."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.test.utils import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from runtime.models import RejectedObservation
from runtime.selectors.metrics import JournalTally
from runtime.transitions.lease import lease_expire_sweep
from tests import factories
from tests.conftest import server_start, wait_for

SCRAPER_TOKEN = "scraper-secret-0123456789abcdef"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _scrape(client: APIClient) -> Samples:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPER_TOKEN}")
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain")
    return _parse(response.content.decode())


@pytest.mark.django_db
@override_settings(METRICS_TOKEN=SCRAPER_TOKEN)
def test_only_the_scraper_token_and_admins_read_the_metrics():
    agent = factories.agent()
    operator = factories.console_user("operator")
    admin = factories.console_user("admin")

    anonymous = APIClient().get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == "Bearer"
    assert anonymous.json()["error"]["code"] == "not_authenticated"
    wrong = APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-scraper-token")
    assert wrong.status_code == 401
    assert agent.client().get("/metrics").status_code == 403
    assert operator.client().get("/metrics").status_code == 403
    signed_in = APIClient()
    signed_in.force_login(operator.actor_user())
    assert signed_in.get("/metrics").status_code == 403
    assert admin.client().get("/metrics").status_code == 200
    signed_in.force_login(admin.actor_user())
    assert signed_in.get("/metrics").status_code == 200
    assert (
        APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPER_TOKEN}").status_code == 200
    )
    assert (
        APIClient().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPER_TOKEN}").status_code
        == 405
    )


@pytest.mark.django_db
def test_without_a_configured_token_a_bearer_is_not_the_scraper():
    # METRICS_TOKEN unset: no bearer value (not even an empty one) makes a scraper.
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer x").status_code == 401


@pytest.mark.django_db
@override_settings(METRICS_TOKEN=SCRAPER_TOKEN)
def test_takeovers_stale_reports_and_budget_refusals_are_counted():
    client = APIClient()
    owner = factories.agent()
    agent = owner.client()
    task = factories.task(owner, budget={"cost_cents": 100})
    made = agent.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.echo", "params": {"q": 1}, "step": "think", "executor": "agent"},
        format="json",
    )
    assert made.status_code == 201, made.content
    op_id = made.json()["id"]
    before = _scrape(client)

    first = agent.post(f"/api/v1/operations/{op_id}/claim", format="json").json()
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=600)) == 1
    late = agent.post(
        f"/api/v1/operations/{op_id}/complete",
        {"lease_generation": 1, "lease_token": first["lease_token"], "outcome": "succeeded"},
        format="json",
    )
    assert late.status_code == 409
    refused = agent.post(
        f"/api/v1/tasks/{task.pk}/operations",
        {"tool": "demo.echo", "step": "too-dear", "estimate": {"cost_cents": 5000}},
        format="json",
    )
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "budget_exhausted"

    after = _scrape(client)
    for name, labels in [
        ("agent_console_lease_takeovers_total", {}),
        ("agent_console_reports_rejected_total", {}),
        ("agent_console_rejected_observations_total", {"kind": "stale_completion"}),
        ("agent_console_budget_refusals_total", {"route": "api-task-ops"}),
        ("agent_console_api_refusals_total", {"error": "budget_exhausted"}),
        ("agent_console_api_refusals_total", {"error": "stale_lease"}),
    ]:
        assert _value(after, name, **labels) == _value(before, name, **labels) + 1, (name, labels)
    assert _value(after, "agent_console_database_up") == 1


@pytest.mark.django_db
def test_the_journal_is_counted_once_as_rows_settle():
    tally = JournalTally(model=RejectedObservation, group="kind")
    old = timezone.now() - timedelta(minutes=5)
    a1 = RejectedObservation.objects.create(kind="a")
    a2 = RejectedObservation.objects.create(kind="a")
    RejectedObservation.objects.filter(pk__in=[a1.pk, a2.pk]).update(at=old)
    b = RejectedObservation.objects.create(kind="b")
    assert tally.totals(timezone.now()) == {"a": 2, "b": 1}
    assert tally.floor == a2.pk  # the recent row is read again next time
    RejectedObservation.objects.filter(pk=b.pk).update(at=old)
    RejectedObservation.objects.create(kind="b")
    assert tally.totals(timezone.now()) == {"a": 2, "b": 2}
    assert tally.floor == b.pk
    assert tally.totals(timezone.now()) == {"a": 2, "b": 2}


@pytest.mark.workers
@pytest.mark.postgres
def test_metrics_move_with_an_operation_run_by_real_workers(workers, tmp_path: Path):
    server = server_start(tmp_path, METRICS_TOKEN=SCRAPER_TOKEN)
    try:
        workers.start()
        owner = factories.agent()
        headers = {"Authorization": f"Bearer {SCRAPER_TOKEN}"}
        with httpx.Client(base_url=server.url, timeout=20) as http:

            def scrape() -> Samples:
                response = http.get("/metrics", headers=headers)
                assert response.status_code == 200, response.text[:300]
                return _parse(response.text)

            assert http.get("/metrics").status_code == 401
            before = scrape()
            task = http.post("/api/v1/tasks", json={"name": "metrics"}, headers=owner.headers)
            assert task.status_code == 201, task.text
            made = http.post(
                f"/api/v1/tasks/{task.json()['id']}/operations",
                json={"tool": "demo.echo", "params": {"n": 1}, "step": "echo"},
                headers=owner.headers,
            )
            assert made.status_code == 201, made.text
            op_url = f"/api/v1/operations/{made.json()['id']}"
            gated = http.post(
                f"/api/v1/tasks/{task.json()['id']}/operations",
                json={
                    "tool": "demo.payments.charge",
                    "params": {"account": "a", "amount_cents": 25000},
                    "step": "pay",
                },
                headers=owner.headers,
            )
            assert gated.status_code == 201, gated.text
            wait_for(
                lambda: http.get(op_url, headers=owner.headers).json()["status"] == "succeeded",
                timeout=60,
                what="the worker to run the operation",
            )
            after = scrape()
    finally:
        server.stop()

    succeeded = "agent_console_operations_settled"
    assert _value(after, succeeded, status="succeeded") == (
        _value(before, succeeded, status="succeeded") + 1
    )
    proposals = "agent_console_http_request_duration_seconds_count"
    labels = {"route": "api-task-ops", "method": "POST", "code": "201"}
    assert _value(after, proposals, **labels) == _value(before, proposals, **labels) + 2
    assert _value(after, "agent_console_workers_live") >= 1
    waiting = {"status": "waiting_approval", "tool": "demo.payments.charge"}
    assert _value(after, "agent_console_operations", **waiting) == (
        _value(before, "agent_console_operations", **waiting) + 1
    )
    assert _value(after, "agent_console_approvals_pending") == (
        _value(before, "agent_console_approvals_pending") + 1
    )
    assert _value(after, "agent_console_approval_pending_age_seconds_bucket", le="+Inf") == (
        _value(after, "agent_console_approvals_pending")
    )
    assert _value(after, "agent_console_database_up") == 1
    # The latency histograms of the work the real worker ran: its claim, its run.
    start = "agent_console_operation_schedule_to_start_seconds_count"
    assert _value(after, start) >= _value(before, start) + 1
    run = "agent_console_operation_run_seconds_count"
    assert _value(after, run, tool="demo.echo") == _value(before, run, tool="demo.echo") + 1
