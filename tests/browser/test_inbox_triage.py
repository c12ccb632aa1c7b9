"""Triage like an inbox (issue 24 point 3) in a real browser: the request about to expire comes
first, other sorts are one choice away and survive live updates; each card says which task,
step and agent it is about and how long it has waited; select-all ticks every request and a
bulk denial still asks first; the keyboard walks the cards (j/k), approves (a), denies with a
reason and the same question as the button (d), edits (e) and lists its keys (?), and never
fires while the person types."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from runtime.models import Approval, Operation, Task
from tests import factories
from tests.browser.conftest import login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _request(
    owner: Any,
    task: Task,
    step: str,
    *,
    waited_min: int,
    expires_in_min: int,
    tool: str = "",
    amount: int = 25000,
) -> Approval:
    """A pending request, created ``waited_min`` minutes ago and expiring in ``expires_in_min``.
    ``tool`` renames the request's tool as shown (one demo tool needs approval; the sort by tool
    only reads the name)."""
    op = factories.operation(
        owner,
        task,
        step=step,
        tool="demo.payments.charge",
        params={"account": f"acct-{step}", "amount_cents": amount},
    )
    now = timezone.now()
    changes: dict[str, Any] = {
        "created_at": now - timedelta(minutes=waited_min),
        "expires_at": now + timedelta(minutes=expires_in_min),
    }
    if tool:
        changes["tool"] = tool
    Approval.objects.filter(operation=op).update(**changes)
    return Approval.objects.get(operation=op)


def _order(page: Page) -> list[str]:
    return page.locator("section.approval[data-approval]").evaluate_all(
        "cards => cards.map(c => c.dataset.approval)"
    )


def test_the_inbox_sorts_soonest_expiring_first_and_by_choice(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    late = _request(owner, task, "old-and-late", waited_min=30, expires_in_min=50)
    soon = _request(owner, task, "about-to-expire", waited_min=10, expires_in_min=5)
    new = _request(owner, task, "just-in", waited_min=1, expires_in_min=20, tool="a.first.tool")

    login(page, server.url, factories.console_user("operator").actor.name)
    page.goto(f"{server.url}/approvals/")
    assert _order(page) == [soon.pk, new.pk, late.pk]
    expect(page.get_by_label("Sort")).to_have_value("expiry")

    # The control applies the sort as soon as it is chosen, and the URL carries it.
    page.get_by_label("Sort").select_option(label="waiting longest first")
    page.wait_for_url(lambda url: "sort=oldest" in url)
    assert _order(page) == [late.pk, soon.pk, new.pk]
    page.goto(f"{server.url}/approvals/?sort=newest")
    assert _order(page) == [new.pk, soon.pk, late.pk]
    page.goto(f"{server.url}/approvals/?sort=tool")
    assert _order(page) == [new.pk, soon.pk, late.pk]  # a.first.tool, then the charges by expiry

    # The live refresh keeps the chosen order: a request that expires sooner arrives first.
    page.goto(f"{server.url}/approvals/?sort=expiry")
    wait_live(page)
    sooner = _request(owner, task, "arrives-live", waited_min=0, expires_in_min=2)
    expect(page.locator("section.approval").first).to_have_attribute("data-approval", sooner.pk)
    assert _order(page) == [sooner.pk, soon.pk, new.pk, late.pk]

    # Each card says what it is about: task (linked), step, agent, how long it has waited.
    card = page.locator(f'section.approval[data-approval="{late.pk}"]')
    expect(card.get_by_role("link", name="pay the suppliers")).to_have_attribute(
        "href", f"/tasks/{task.pk}/"
    )
    expect(card.locator('[data-field="step"]')).to_have_text("old-and-late")
    expect(card.locator('[data-field="agent"]')).to_have_text(owner.actor.label)
    expect(card.locator('[data-field="waited"]')).to_have_text("30m")
    expect(card.locator(".amount")).to_have_text("$250.00 (25000 cents)")

    # A sort the page does not know: said plainly, nothing listed, never a 500.
    response = page.goto(f"{server.url}/approvals/?sort=loudest")
    assert response is not None and response.status == 400
    expect(page.locator("#filter-problems")).to_contain_text("“sort” is one of expiry")
    expect(page.locator("section.approval[data-approval]")).to_have_count(0)
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_select_all_ticks_every_request_and_a_bulk_denial_still_asks_first(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    requests = [
        _request(owner, task, f"pay-{i}", waited_min=i, expires_in_min=30 + i) for i in range(3)
    ]
    login(page, server.url, factories.console_user("operator").actor.name)
    page.goto(f"{server.url}/approvals/")
    boxes = page.locator("section.approval input[name=selected]")
    select_all = page.get_by_label("Select all")

    select_all.check()
    assert boxes.evaluate_all("bs => bs.map(b => b.checked)") == [True, True, True]
    boxes.nth(1).uncheck()
    assert select_all.evaluate("b => [b.checked, b.indeterminate]") == [False, True]
    select_all.check()
    assert boxes.evaluate_all("bs => bs.map(b => b.checked)") == [True, True, True]

    page.locator("#bulk-form input[name=reason]").fill("not this month")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Deny selected").click()
    assert len(asked) == 1 and "Deny the 3 selected request(s)?" in asked[0], asked
    page.evaluate("1")  # a round trip through the page: a submit would have started by now
    assert posts == []
    assert {a.status for a in Approval.objects.filter(pk__in=[r.pk for r in requests])} == {
        "pending"
    }

    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Deny selected").click()
    expect(page.locator("ul.messages li.success")).to_have_count(3)
    assert {a.status for a in Approval.objects.filter(pk__in=[r.pk for r in requests])} == {
        "denied"
    }
    expect(page.locator("#approvals-empty")).to_be_visible()
    expect(select_all).to_be_disabled()  # nothing left to select


def _current(page: Page) -> str | None:
    return page.evaluate(
        "() => { const c = document.querySelector('section.approval.is-current');"
        " return c ? c.dataset.approval : null; }"
    )


def test_keyboard_shortcuts_walk_approve_deny_and_edit_but_never_while_typing(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    first = _request(owner, task, "first", waited_min=5, expires_in_min=10, amount=12000)
    second = _request(owner, task, "second", waited_min=5, expires_in_min=20)
    login(page, server.url, factories.console_user("operator").actor.name)
    page.goto(f"{server.url}/approvals/")
    page.locator("h1").click()  # the page has the keys, no field

    # j/k: next and previous, the card focused and visibly marked.
    page.keyboard.press("j")
    assert _current(page) == first.pk
    card = page.locator(f'section.approval[data-approval="{first.pk}"]')
    expect(card).to_be_focused()
    assert card.evaluate("c => getComputedStyle(c).boxShadow") != "none"
    page.keyboard.press("j")
    assert _current(page) == second.pk
    page.keyboard.press("j")  # stays on the last one
    assert _current(page) == second.pk
    page.keyboard.press("k")
    assert _current(page) == first.pk

    # ?: the list of shortcuts, and ? again (or Escape) hides it.
    page.keyboard.press("?")
    shortcuts = page.locator("dialog#shortcuts")
    expect(shortcuts).to_be_visible()
    expect(shortcuts).to_contain_text("approve it")
    page.keyboard.press("Escape")
    expect(shortcuts).to_be_hidden()

    # Typing in a field is typing: no key acts, the letters land in the field.
    task_filter = page.get_by_label("Task", exact=True)
    task_filter.click()
    page.keyboard.type("jkade?x")
    expect(task_filter).to_have_value("jkade?x")
    expect(shortcuts).to_be_hidden()
    assert _current(page) == first.pk
    assert Approval.objects.get(pk=first.pk).status == "pending"
    task_filter.fill("")

    # e: edit the focused request's parameters; Escape leaves the editor.
    card.focus()
    page.keyboard.press("e")
    editor = card.locator("textarea[name=params]")
    expect(editor).to_be_focused()
    expect(card.locator("details.edit")).to_have_attribute("open", "")
    page.keyboard.press("Escape")
    expect(card).to_be_focused()

    # d: the reason first (as the button requires), then the button's own question.
    page.keyboard.press("d")
    reason = card.get_by_placeholder("reason (required)")
    expect(reason).to_be_focused()
    expect(page.locator("#shortcut-note")).to_contain_text(f"Type why you deny {first.pk}")
    page.keyboard.type("too much this month")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.keyboard.press("Enter")
    assert len(asked) == 1 and f"Deny request {first.pk}" in asked[0], asked
    assert "$120.00 (12000 cents)" in asked[0] and "cannot be undone" in asked[0]
    page.evaluate("1")
    assert Approval.objects.get(pk=first.pk).status == "pending"  # dismissed: nothing done
    page.keyboard.press("Escape")
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.keyboard.press("d")  # the reason is there: straight to the question
    expect(page.locator("ul.messages")).to_contain_text(f"Request {first.pk} is denied")
    assert len(asked) == 2
    denied = Approval.objects.get(pk=first.pk)
    assert (denied.status, denied.reason) == ("denied", "too much this month")

    # a: approve the focused request (after the reload, j picks the first card again).
    page.locator("h1").click()
    page.keyboard.press("j")
    assert _current(page) == second.pk
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.keyboard.press("a")  # the same question as the button, naming the amount
    expect(page.locator("ul.messages")).to_contain_text(f"Request {second.pk} is approved")
    assert f"Approve request {second.pk} and release $250.00" in asked[-1]
    assert Approval.objects.get(pk=second.pk).status == "approved"
    assert Operation.objects.get(pk=second.operation_id).status != "waiting_approval"
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_a_shortcut_says_why_when_the_person_may_not_decide(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "pay the suppliers")
    request = _request(owner, task, "pay", waited_min=1, expires_in_min=10)
    login(page, server.url, factories.console_user("support").actor.name)
    page.goto(f"{server.url}/approvals/")
    page.locator("h1").click()
    page.keyboard.press("j")
    assert _current(page) == request.pk
    page.keyboard.press("a")
    expect(page.locator("#shortcut-note")).to_have_text("Only operators decide.")
    assert Approval.objects.get(pk=request.pk).status == "pending"
