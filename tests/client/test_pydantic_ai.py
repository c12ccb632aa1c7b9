"""The Pydantic AI adapter end to end: the example agent (``python -m
agent_console_client.examples.refund``, a FunctionModel) runs as its own process against the real
web server and a real worker, asks for a refund above the approval threshold, and waits; an
operator denies it over the API, or approves it in Chromium on /approvals/. The run resumes with
the console's decision: the charge happens once at the receiver, or not at all and the model
hears the operator's reason. Each model call is an operation whose tokens reach the budget."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from agent_console_client import Client
from playwright.sync_api import Page, expect

from runtime.models import Operation
from runtime.sandbox import receivers
from tests import factories
from tests.browser.conftest import login, wait_live
from tests.conftest import ROOT, service_env, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.workers]

WAITING = re.compile(r"waiting for a person to decide approval (\S+) \(operation (\S+)\)")


class Example:
    """The example agent as a process, its output collected line by line."""

    def __init__(self, base_url: str, token: str, amount: int) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "agent_console_client.examples.refund",
                "--base-url", base_url, "--token", token, "--amount-cents", str(amount),
                "--timeout", "120",
            ],
            cwd=ROOT, env=service_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def waiting(self) -> tuple[str, str]:
        found = wait_for(
            lambda: WAITING.search(self.text), timeout=90, what=f"the agent to wait:\n{self.text}"
        )
        return found.group(1), found.group(2)

    def finish(self) -> int:
        code = self.proc.wait(timeout=120)
        self.reader.join(10)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def example_run(server, workers) -> Iterator[tuple[Example, factories.Principal]]:
    workers.start(count=1, concurrency=1)
    agent = factories.agent()
    run = Example(server.url, agent.token, 25000)
    try:
        yield run, agent
    finally:
        run.stop()


def _model_calls(task_id: str) -> list[Operation]:
    return list(Operation.objects.filter(task_id=task_id, step__startswith="run:refund:turn:"))


def test_a_denied_refund_reaches_the_model_with_the_operators_reason(server, example_run):
    run, _agent = example_run
    approval_id, op_id = run.waiting()
    op = Operation.objects.get(pk=op_id)
    assert op.status == "waiting_approval" and op.step.startswith("call-")
    assert op.params == {"account": "cust-1001", "amount_cents": 25000}

    operator = factories.console_user("operator")
    with Client(base_url=server.url, token=operator.token) as console:
        console.decide(approval_id, "deny", reason="already refunded by hand")

    assert run.finish() == 0, run.text
    assert "refund denied" in run.text and "already refunded by hand" in run.text, run.text
    assert receivers.effects_under("payments", op.idempotency_key) == []
    calls = _model_calls(op.task_id)
    assert len(calls) == 2 and all(c.status == "succeeded" for c in calls)
    # Under the console's own model tool, which production offers too (not a demo tool).
    assert {(c.tool, c.executor) for c in calls} == {("model.call", "agent")}
    posted = re.search(r"model_tokens posted: ([0-9.]+)", run.text)
    assert posted and float(posted.group(1)) > 0, run.text


@pytest.mark.browser
def test_a_refund_approved_in_the_browser_resumes_the_run_and_charges_once(
    page: Page, server, example_run
):
    run, _agent = example_run
    approval_id, op_id = run.waiting()
    operator = factories.console_user("operator")
    login(page, server.url, operator.actor.name)
    page.goto(f"{server.url}/approvals/")
    wait_live(page)
    card = page.locator(f'section.approval[data-approval="{approval_id}"]')
    expect(card).to_be_visible()
    page.once("dialog", lambda d: d.accept())  # it names the amount (test_guarded_release.py)
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("ul.messages")).to_contain_text("approved")

    assert run.finish() == 0, run.text
    assert "refund success" in run.text, run.text
    op = Operation.objects.get(pk=op_id)
    assert op.status == "succeeded"
    effects = receivers.effects_under("payments", op.idempotency_key)
    assert [e["amount_cents"] for e in effects] == [25000]
    # One operation for the tool call, whatever the resumed run did.
    assert Operation.objects.filter(task_id=op.task_id, tool="demo.payments.charge").count() == 1
    assert len(_model_calls(op.task_id)) == 2
