"""The task page in a real browser against the web server and real workers: it follows the
journal over its websocket, shows what happens without a reload, and catches up after losing
the socket."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, WebSocketRoute, expect

from runtime.errors import StaleLease
from runtime.models import Event, Execution
from runtime.transitions.accept import operation_report
from runtime.transitions.accept_decision import Report
from runtime.transitions.claim import operation_claim
from runtime.transitions.lease import Lease, lease_expire_sweep
from tests import factories
from tests.browser.conftest import operator, poll, wait_live
from tests.conftest import journal_note, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def _execution(label: str) -> str:
    # Not execution_current(): it caches this process's id, which the previous test's flush
    # removed from the database.
    return Execution.objects.create(kind="worker", host="browser-tests", label=label).pk


def timeline_seqs(page: Page) -> list[int]:
    return [
        int(s)
        for s in page.locator("#timeline li").evaluate_all("els => els.map(e => e.dataset.seq)")
    ]


def journal_seqs(task_id: str) -> list[int]:
    return list(Event.objects.filter(task_id=task_id).order_by("seq").values_list("seq", flat=True))


def test_operation_appears_and_succeeds_live_without_reload(page: Page, server, workers):
    owner = factories.agent()
    task = factories.task(owner, "summarise the quarterly report")
    operator(page, server.url)
    page.goto(f"{server.url}/tasks/{task.pk}/")
    wait_live(page)
    page.evaluate("window.__marker = 1")
    expect(page.locator("#operations")).to_contain_text("No operations yet")

    # No worker yet: the proposal alone must reach the page.
    op = factories.operation(owner, task, params={"q": "revenue"})
    row = page.locator(f'#operations tr[data-operation="{op.pk}"]')
    expect(row).to_have_attribute("data-status", "pending")
    expect(page.locator("#timeline li .etype", has_text="operation.proposed")).to_have_count(1)

    workers.start(count=1, concurrency=1)
    expect(row).to_have_attribute("data-status", "succeeded", timeout=60_000)
    expect(row.locator("[data-field=lease_generation]")).to_have_text("1")
    expect(row).to_contain_text("revenue")
    for etype in ("operation.proposed", "operation.claimed", "operation.succeeded"):
        expect(page.locator(f'#timeline li[data-seq] .etype:text-is("{etype}")')).to_have_count(1)
    # Every journal event shown once, in order, and the page was never reloaded.
    wait_for(lambda: timeline_seqs(page) == journal_seqs(task.pk), what="timeline = journal")
    assert timeline_seqs(page) == list(range(1, len(timeline_seqs(page)) + 1))
    assert page.evaluate("window.__marker") == 1
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_reconnect_catches_up_every_event_exactly_once_in_order(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "catch-up")
    operator(page, server.url)

    # Every socket of the page goes through here, so the test can drop it and hold the
    # reconnection attempts off while the journal moves on.
    sockets: list[tuple[WebSocketRoute, WebSocketRoute]] = []
    refuse = {"on": False}
    attempts = {"n": 0}

    def route(ws: WebSocketRoute) -> None:
        attempts["n"] += 1
        if refuse["on"]:
            ws.close(code=3001, reason="test: network down")
            return
        sockets.append((ws, ws.connect_to_server()))

    page.route_web_socket(re.compile(r"/ws/tasks/"), route)
    page.goto(f"{server.url}/tasks/{task.pk}/")
    wait_live(page)
    page.evaluate("window.__marker = 1")

    for i in range(3):
        journal_note(task.pk, f"while connected {i}")
    wait_for(lambda: timeline_seqs(page) == journal_seqs(task.pk), what="live events shown")

    refuse["on"] = True
    page_side, server_side = sockets[-1]
    server_side.close()
    page_side.close(code=3001, reason="test: connection lost")
    expect(page.locator("#live-status")).not_to_have_attribute("data-state", "live")
    seen_before = attempts["n"]
    for i in range(12):
        journal_note(task.pk, f"while offline {i}")
    # The page kept trying (and was refused) while the events were written.
    poll(page, lambda: attempts["n"] > seen_before, what="a refused reconnection attempt")
    assert len(timeline_seqs(page)) == 4

    refuse["on"] = False
    wait_live(page)
    for i in range(2):
        journal_note(task.pk, f"after reconnect {i}")
    expected = journal_seqs(task.pk)
    assert expected == list(range(1, 1 + 3 + 12 + 2 + 1))
    wait_for(lambda: timeline_seqs(page) == expected, what="timeline to catch up")
    texts = page.locator("#timeline li").all_inner_texts()
    assert sum("while offline" in t for t in texts) == 12
    assert page.evaluate("window.__marker") == 1
    # The resumed socket asked only for what the page had not seen.
    assert sockets[-1][0].url.endswith("?after=4")


def test_stale_report_shows_under_rejected_observations_with_its_generation(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "fenced")
    op = factories.operation(owner, task, params={"x": 1})
    operator(page, server.url)
    page.goto(f"{server.url}/tasks/{task.pk}/")
    expect(page.locator("#rejections")).to_contain_text("None")

    old = operation_claim(op.pk, execution_id=_execution("stalled"))
    assert isinstance(old, Lease) and old.lease_generation == 1
    assert lease_expire_sweep(now=timezone.now() + timedelta(seconds=120)) == 1
    new = operation_claim(op.pk, execution_id=_execution("replacement"))
    assert isinstance(new, Lease) and new.lease_generation == 2
    with pytest.raises(StaleLease):
        operation_report(
            op.pk,
            lease_generation=old.lease_generation,
            lease_token=old.lease_token,
            state_version=old.state_version,
            report=Report(outcome="succeeded", result={"late": True}),
            execution_id=None,
        )

    # The takeover reached the page live; the refused report is on it after a load.
    row = page.locator(f'#operations tr[data-operation="{op.pk}"]')
    expect(row).to_have_attribute("data-status", "running")
    expect(row.locator("[data-field=lease_generation]")).to_have_text("2")
    page.reload()
    rejected = page.locator("#rejections tbody tr")
    expect(rejected).to_have_count(1)
    expect(rejected).to_contain_text("stale_completion")
    expect(rejected).to_contain_text(op.pk)
    cells = rejected.locator("td").all_inner_texts()
    assert cells[3] == "1"  # the stale generation, not the current one
    expect(row).not_to_contain_text("late")


def test_page_of_a_session_that_ended_says_so_and_never_shows_the_login_form_inline(
    page: Page, server
):
    task = factories.task(factories.agent(), "watched")
    operator(page, server.url)
    page.goto(f"{server.url}/tasks/{task.pk}/")
    wait_live(page)

    # Logged out from another tab of the same browser.
    other = page.context.new_page()
    other.goto(f"{server.url}/tasks/")
    other.get_by_role("button", name="Log out").click()
    other.wait_for_url(f"{server.url}/login/")

    # The next event makes the page re-fetch its fragment, which now answers with the login
    # page: the page stops following and tells the person, instead of embedding that page.
    journal_note(task.pk, "after logout")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "signed-out")
    expect(page.locator("#live-status")).to_contain_text("signed out")
    assert page.locator("#task-live input[name=password]").count() == 0
    expect(page.locator("#task-live h1")).to_have_text("watched")


def _timeline_rows(page: Page) -> list[dict[str, Any]]:
    return page.locator("#timeline li").evaluate_all(
        """els => els.map(e => ({
            type: e.querySelector('.etype').textContent,
            time: e.querySelector('time').textContent,
            step: e.querySelector('.step') ? e.querySelector('.step').textContent : null,
            after: e.querySelector('.after') ? e.querySelector('.after').textContent : null,
        }))"""
    )


def _check_steps_and_gaps(rows: list[dict[str, Any]]) -> None:
    ops = [r for r in rows if r["type"].startswith("operation.")]
    assert [r["type"] for r in ops] == [
        "operation.proposed",
        "operation.claimed",
        "operation.succeeded",
    ], rows
    assert all(r["step"] == "fetch-invoices" for r in ops), ops
    # The first event of an operation has nothing before it; the others say how long after.
    assert ops[0]["after"] is None, ops
    assert all(re.fullmatch(r"\+\d+\.\ds", r["after"] or "") for r in ops[1:]), ops
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", r["time"]) for r in rows), rows


def test_the_timeline_names_each_step_says_how_long_after_and_the_page_has_a_jump_list(
    page: Page, server, workers
):
    """Issue 24 point 6: the timeline shows each operation's step and the time since that
    operation's previous event, with times in their zone, alike when events arrive live and
    when the page is rendered; the task page's sections can be jumped to."""
    owner = factories.agent()
    task = factories.task(owner, "timeline steps")
    operator(page, server.url)
    page.goto(f"{server.url}/tasks/{task.pk}/")
    wait_live(page)
    factories.operation(owner, task, step="fetch-invoices")
    workers.start(count=1, concurrency=1)
    done = page.locator('#timeline li .etype:text-is("operation.succeeded")')
    expect(done).to_have_count(1, timeout=60_000)
    _check_steps_and_gaps(_timeline_rows(page))  # as console.js rendered them, live

    page.reload()
    wait_live(page)
    _check_steps_and_gaps(_timeline_rows(page))  # as the server renders them
    page.get_by_role("navigation", name="On this page").get_by_role("link", name="Timeline").click()
    assert page.url.endswith("#timeline-title")
    assert page.page_errors == []  # type: ignore[attr-defined]
