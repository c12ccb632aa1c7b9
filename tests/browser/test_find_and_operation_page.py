"""Finding things (issue 24 points 5, 6, 9) in a real browser: the task list's search finds a
task by its id, an operation's id or idempotency key and an approval's id; an operation has its
own page with its whole story, and operation ids on the console's pages link to it; the tool
catalogue has a page."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.models import Execution, Operation, Task
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease
from runtime.waits import wait_sweep
from tests import factories
from tests.browser.conftest import login, operator, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


@dataclass
class World:
    task: Task
    charge: Operation  # gated, approved, claimed: one invocation under lease generation 1
    keyed: Operation  # proposed with the agent's own idempotency key
    approval_id: str


def _world() -> World:
    owner = factories.agent()
    for i in range(30):  # more than a page of other tasks, newer and older
        factories.task(owner, f"filler {i:02d}")
    task = factories.task(owner, "the one to find", budget={"cost_cents": 100000})
    for i in range(3):
        factories.task(owner, f"newer filler {i}")
    charge = factories.operation(
        owner,
        task,
        step="charge the customer",
        tool="demo.payments.charge",
        params={"account": "acct \u202e42", "amount_cents": 25000},
        estimate={"cost_cents": 300},
    )
    approval = charge.approvals.get()
    decided = (
        factories.console_user("operator")
        .client()
        .post(
            f"/api/v1/approvals/{approval.pk}/decision",
            {"decision": "approve", "reason": "known customer", "params_hash": charge.params_hash},
            format="json",
        )
    )
    assert decided.status_code == 200, decided.content
    execution = Execution.objects.create(kind="worker", host="browser-tests", label="find")
    assert isinstance(operation_claim(charge.pk, execution_id=execution.pk), Lease)
    keyed = factories.operation(owner, task, step="tell", idempotency_key="order-4711")
    return World(task, charge, keyed, approval.pk)


@pytest.mark.parametrize("by", ["task id", "operation id", "idempotency key", "approval id"])
def test_the_task_list_finds_a_task_by_what_it_owns(page: Page, server, by):
    w = _world()
    text, operation = {
        "task id": (w.task.pk, None),
        "operation id": (w.charge.pk, w.charge),
        "idempotency key": (w.keyed.idempotency_key, w.keyed),
        "approval id": (w.approval_id, w.charge),
    }[by]
    operator(page, server.url)
    page.goto(f"{server.url}/tasks/")
    page.get_by_label("Search").fill(text)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/tasks/?q=*")
    rows = page.locator("#task-rows tr[data-task]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-task", w.task.pk)
    if operation is not None:
        # What the text named is one click away: its operation's page.
        page.locator("#search-hits").get_by_role("link", name=operation.pk).click()
        page.wait_for_url(f"**/operations/{operation.pk}/")
        expect(page.get_by_role("heading", level=1)).to_contain_text(operation.pk)


def test_an_operation_page_tells_its_whole_story(page: Page, server):
    w = _world()
    operator(page, server.url)
    page.goto(f"{server.url}/operations/{w.charge.pk}/")
    summary = page.locator("#op-summary")
    expect(summary.locator("[data-field=step]")).to_have_text("charge the customer")
    expect(summary.locator("[data-field=tool]")).to_contain_text("demo.payments.charge")
    expect(summary.locator("[data-field=tool]")).to_contain_text("replay")
    # Parameters through the visible filter: the bidi override is shown, not obeyed.
    expect(summary.locator("[data-field=params]")).to_contain_text("acct <U+202E>42")
    expect(summary.locator("[data-field=status]")).to_contain_text("running")
    # Status history from the journal, oldest first, times with their zone.
    statuses = page.locator("#op-transitions tbody tr td:nth-child(4)").all_inner_texts()
    assert statuses == ["waiting_approval", "pending", "running"], statuses
    expect(page.locator("#op-transitions tbody tr").first.locator("time")).to_contain_text("UTC")
    expect(
        page.locator("#op-invocations tr[data-invocation='1'] [data-field=outcome]")
    ).to_have_text("in flight")
    expect(page.locator("#op-leases tr[data-generation='1']")).to_contain_text("current")
    approval = page.locator(f"#op-approvals tr[data-approval='{w.approval_id}']")
    expect(approval).to_have_attribute("data-status", "released")  # approved, then claimed
    expect(approval).to_contain_text("known customer")
    expect(page.locator("#op-holds tbody tr").first).to_contain_text("cost_cents")
    expect(page.locator("#op-resolutions")).to_contain_text("No person has resolved it")
    # The tool links to its entry in the catalogue's page.
    summary.get_by_role("link", name="demo.payments.charge").click()
    page.wait_for_url("**/tools/#tool-demo.payments.charge")
    entry = page.locator("[data-tool='demo.payments.charge']")
    expect(entry.locator("[data-field=approval]")).to_contain_text("amount_cents above 10000")
    expect(entry.locator("[data-field=params_schema]")).to_contain_text('"amount_cents"')
    assert page.page_errors == []  # type: ignore[attr-defined]


def _linking_world(where: str) -> tuple[str, Operation]:
    """An operation shown on page ``where``, and that page's path."""
    owner = factories.agent()
    task = factories.task(owner, "linked")
    if where == "task":
        return f"/tasks/{task.pk}/", factories.operation(owner, task, step="plain")
    if where == "approvals":
        gated = factories.operation(
            owner, task, tool="demo.payments.charge", params={"account": "a", "amount_cents": 20000}
        )
        return "/approvals/", gated
    if where == "unresolved":
        op = factories.operation(owner, task, tool="demo.notify", params={"to": "x@example.com"})
        Operation.objects.filter(pk=op.pk).update(status="unresolved")
        return "/unresolved/", op
    wait = factories.operation(
        owner, task, step="await go", kind="wait_signal", tool="", signal="go", timeout_seconds=60
    )
    Operation.objects.filter(pk=wait.pk).update(wait_until=timezone.now())
    assert wait_sweep()["waits_expired"] == 1
    return "/waits/", wait


@pytest.mark.parametrize("where", ["task", "approvals", "unresolved", "waits"])
def test_operation_ids_link_to_the_operation_page(page: Page, server, where):
    path, op = _linking_world(where)
    admin = factories.console_user("admin")  # sees every queue, waits included
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}{path}")
    # Live pages re-render their rows when the socket catches up; a click whose press and
    # release straddle that swap lands on two different links and is no click at all (seen
    # once under load). Click once the page is live and its fragments are fetched.
    wait_live(page)
    page.wait_for_load_state("networkidle")
    page.get_by_role("link", name=op.pk, exact=True).first.click()
    page.wait_for_url(f"**/operations/{op.pk}/")
    expect(page.locator("#op-summary")).to_have_attribute("data-operation", op.pk)
