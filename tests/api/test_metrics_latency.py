"""``/metrics``' latency histograms and build info (issue 40): schedule to start, run time by
tool and time to a person's decision move when work runs (scraped before and after, counts
compared), each interval observed once however often it is scraped; the build is named."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test.utils import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from console.metrics import git_commit
from runtime.approvals import approval_decide
from runtime.executions import execution_for_agent
from runtime.models import Approval, Operation
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from tests import factories
from tests.api.test_metrics import SCRAPER_TOKEN, Samples, _scrape, _value

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

START = "agent_console_operation_schedule_to_start_seconds"
RUN = "agent_console_operation_run_seconds"
DECISION = "agent_console_approval_decision_seconds"
TRANSIENT = Report(outcome="failed", error_kind="transient", message="try again")


def _run_three_attempts() -> Operation:
    """demo.echo failing twice (transient) and then succeeding: three claims, three reports."""
    owner = factories.agent()
    op = factories.operation(owner, factories.task(owner), tool="demo.echo", params={"v": 1})
    execution = execution_for_agent("worker-latency").pk
    for report in (TRANSIENT, TRANSIENT, Report(outcome="succeeded", result={"v": 1})):
        lease = operation_claim(op.pk, execution_id=execution)
        assert isinstance(lease, Lease), lease
        operation_report(
            op.pk,
            lease_generation=lease.lease_generation,
            lease_token=lease.lease_token,
            state_version=lease.state_version,
            report=report,
            execution_id=execution,
        )
        # The retry's backoff is random: made due now (its interval then starts at the claim).
        Operation.objects.filter(pk=op.pk).update(
            next_attempt_at=timezone.now() - timedelta(seconds=1)
        )
    op.refresh_from_db()
    assert op.status == "succeeded"
    return op


def _approve_one() -> None:
    owner, operator = factories.agent(), factories.console_user("operator")
    op = factories.operation(
        owner,
        factories.task(owner),
        tool="demo.payments.charge",
        params={"account": "acct-1", "amount_cents": 25000},
    )
    approval = Approval.objects.get(operation=op)
    approval_decide(
        operator.actor,
        approval.pk,
        decision="approve",
        reason="looks right",
        params_hash=approval.params_hash,
    )


def _moved(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return _value(after, f"{name}_count", **labels) - _value(before, f"{name}_count", **labels)


@override_settings(METRICS_TOKEN=SCRAPER_TOKEN, APPROVAL_SEAL_KEYS=["seal-key-1"])
def test_the_latency_histograms_move_when_work_runs_and_count_each_interval_once():
    client = APIClient()
    before = _scrape(client)
    _run_three_attempts()
    _approve_one()
    after = _scrape(client)
    again = _scrape(client)

    assert _moved(after, before, START) == 3  # three claims, each after its due time
    assert _moved(after, before, RUN, tool="demo.echo") == 3  # two failures, one success
    assert _moved(after, before, DECISION, decision="approved") == 1
    assert _moved(after, before, DECISION, decision="denied") == 0
    for name, labels in [(START, {}), (RUN, {"tool": "demo.echo"}), (DECISION, {})]:
        if name == DECISION:
            labels = {"decision": "approved"}
        # A histogram's +Inf bucket is its count; the sum of non-negative intervals grows.
        assert _value(after, f"{name}_bucket", le="+Inf", **labels) == _value(
            after, f"{name}_count", **labels
        )
        assert _value(after, f"{name}_sum", **labels) >= _value(before, f"{name}_sum", **labels)
        # Scraped again without new work: nothing counted twice.
        assert _value(again, f"{name}_count", **labels) == _value(after, f"{name}_count", **labels)


@override_settings(METRICS_TOKEN=SCRAPER_TOKEN)
def test_the_build_is_named():
    samples = _scrape(APIClient())
    builds = [labels for (name, labels) in samples if name == "agent_console_build_info"]
    assert len(builds) == 1
    build = dict(builds[0])
    assert build["version"] == "0.1.0"
    commit = django_settings.GIT_COMMIT or git_commit(django_settings.BASE_DIR)
    assert build["commit"] == (commit or "unknown")
    if (Path(django_settings.BASE_DIR) / ".git").exists():
        # A checkout names its commit (a source archive, without .git, says "unknown").
        assert commit, "a git checkout's commit is read from .git"
