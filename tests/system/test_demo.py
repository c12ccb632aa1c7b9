"""``manage.py demo --once`` against a running stack (the real web server and a worker): one pass
leaves refunds waiting for approval, a notification unresolved, a report whose checks passed,
a flaky call retried to success and a budget that refused its next call; the accounts and the
URL come last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.models import Approval, Artifact, CheckResult, Operation, Task
from tests.conftest import ROOT, server_start, service_env

pytestmark = [pytest.mark.workers, pytest.mark.postgres]


def test_one_demo_pass_leaves_every_page_something_to_show(workers, tmp_path: Path):
    server = server_start(tmp_path)
    try:
        workers.start(concurrency=2, RETRY_BASE_SECONDS="0.2")
        done = subprocess.run(
            [sys.executable, "manage.py", "demo", "--once", "--url", server.url],
            cwd=ROOT,
            env=service_env(CONSOLE_DATA_DIR=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith(f"Open {server.url}/approvals/"), lines[-5:]
    assert any("console user demo-operator" in line for line in lines), lines

    pending = Approval.objects.filter(status="pending", tool="demo.payments.charge")
    assert pending.count() == 2
    assert Operation.objects.filter(tool="demo.notify", status="unresolved").count() == 1
    flaky = Operation.objects.get(tool="demo.inventory.reserve")
    assert flaky.status == "succeeded" and flaky.attempts_used == 3
    report = Task.objects.get(name__startswith="weekly report")
    assert report.outcome == "succeeded"
    artifact = Artifact.objects.get(task=report, name="report.json", status="accepted")
    results = CheckResult.objects.filter(task=report, subject=artifact, result="passed")
    assert set(results.values_list("name", flat=True)) == {"has report", "report shape"}
    budgeted = Task.objects.get(name__startswith="summarise tickets")
    assert Operation.objects.filter(task=budgeted).count() == 2  # the third was refused
    assert "refused" in done.stdout
