"""The queues' histories without a browser: keyset pages that neither skip nor repeat a row,
every filter value the page cannot read answered with a 400 page naming it (never a 500),
the inbox's sort and status checked the same way, and who may read the histories."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.web import history
from runtime.approvals import approval_decide
from runtime.models import Approval, Operation, Resolution
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _browser(role: str) -> Client:
    person = factories.console_user(role)
    client = Client()
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client


def _decided(n: int) -> list[str]:
    """``n`` denied requests, decided a minute apart (the newest last), two at the same instant."""
    owner = factories.agent()
    task = factories.task(owner, "pay")
    at = timezone.now() - timedelta(hours=1)
    ids = []
    for i in range(n):
        op = factories.operation(
            owner,
            task,
            tool="demo.payments.charge",
            params={"account": "a", "amount_cents": 20000 + i},
        )
        when = at + timedelta(minutes=i if i != 1 else 0)  # rows 0 and 1 share their instant
        Approval.objects.filter(operation=op).update(
            status="denied", decided_by="user:op", decided_at=when, reason=f"r{i}"
        )
        ids.append(Approval.objects.get(operation=op).pk)
    return ids


def _walk(client: Client, url: str, attribute: str) -> list[list[str]]:
    """Every page from ``url`` on, following "Older" links: the row ids of each."""
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content[:300]
        body = response.content.decode()
        pages.append(re.findall(rf'{attribute}="([^"]+)"', body))
        older = re.search(r'<a rel="next" href="([^"]+)"', body)
        url = older.group(1).replace("&amp;", "&") if older else ""
    return pages


def test_decided_requests_page_by_keyset_without_skipping_or_repeating(monkeypatch):
    monkeypatch.setattr(history, "PAGE_SIZE", 2)
    ids = _decided(5)
    client = _browser("operator")
    pages = _walk(client, "/approvals/?status=decided&person=op", "data-decided-approval")
    # Latest decision first; ties on the instant broken by id, newest id first.
    tie = sorted(ids[:2], reverse=True)
    assert pages == [[ids[4], ids[3]], [ids[2], tie[0]], [tie[1]]]
    assert "person=op" in client.get("/approvals/?status=decided&person=op").content.decode()


def test_resolutions_page_by_keyset(monkeypatch):
    monkeypatch.setattr(history, "PAGE_SIZE", 2)
    owner = factories.agent()
    task = factories.task(owner, "notify")
    at = timezone.now() - timedelta(hours=1)
    expected = []
    for i in range(5):
        op = factories.operation(owner, task, tool="demo.notify", params={"to": f"{i}@x"})
        Resolution.objects.create(
            operation=op,
            actor="user:support",
            resolution="no_effect",
            evidence=f"e{i}",
            from_status="unresolved",
            to_status="failed",
            state_version=1,
            at=at + timedelta(minutes=i),
        )
        expected.insert(0, op.pk)
    pages = _walk(_browser("support"), "/unresolved/?status=resolved", "data-resolved-operation")
    assert pages == [expected[:2], expected[2:4], expected[4:]]


BAD = {
    "since=yesterday": "“since” is not a date or a time",
    "until=2026-02-30": "“until” is not a date or a time",
    "until=9999-12-31": "“until” is not a date or a time",  # its end is past the calendar
    "since=2026-12-04T25:00": "“since” is not a date or a time",
    "since=2026-12-05&until=2026-12-04": "“since” is not before “until”",
    "task=tsk%20x%3B--": "“task” is not a task id",
    "person=%01": "“person” is too long or holds control characters",
    "tool=" + "x" * 201: "“tool” is too long or holds control characters",
    "before=bm9wZQ": "The page link is damaged",
}


@pytest.mark.parametrize("path", ["/approvals/?status=decided", "/unresolved/?status=resolved"])
@pytest.mark.parametrize("query", list(BAD), ids=list(BAD))
def test_a_filter_the_history_cannot_read_is_a_400_page_naming_it(path, query):
    _decided(1)
    response = _browser("operator").get(f"{path}&{query}")
    assert response.status_code == 400
    body = response.content.decode()
    assert BAD[query] in body.replace("&#x27;", "'")
    assert 'id="filter-problems"' in body and "data-decided-approval" not in body


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("/approvals/?sort=loudest", "“sort” is one of expiry"),
        ("/approvals/?status=everything", "“status” is pending"),
        ("/fragments/approvals?sort=loudest", ""),
        ("/unresolved/?status=everything", "status is unresolved (the queue) or resolved"),
    ],
)
def test_the_queues_refuse_a_sort_or_status_they_do_not_know_with_a_400(url, said):
    owner = factories.agent()
    factories.operation(
        owner,
        factories.task(owner),
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 20000},
    )
    response = _browser("operator").get(url)
    assert response.status_code == 400
    assert said in response.content.decode()
    assert "data-approval=" not in response.content.decode()


def test_the_inbox_puts_the_request_about_to_expire_first_and_the_api_keeps_its_order():
    owner = factories.agent()
    task = factories.task(owner)
    now = timezone.now()
    first, second = (
        factories.operation(
            owner, task, tool="demo.payments.charge", params={"account": a, "amount_cents": 20000}
        )
        for a in ("a", "b")
    )
    Approval.objects.filter(operation=first).update(expires_at=now + timedelta(hours=2))
    Approval.objects.filter(operation=second).update(expires_at=now + timedelta(minutes=5))
    page = _browser("operator").get("/approvals/").content.decode()
    order = re.findall(r'data-approval="([^"]+)"', page)
    a_first, a_second = (Approval.objects.get(operation=o).pk for o in (first, second))
    assert order == [a_second, a_first]
    api = factories.console_user("operator").client().get("/api/v1/approvals?status=pending")
    assert [r["id"] for r in api.json()["results"]] == [a_first, a_second]  # oldest first


def test_whoever_sees_a_queue_sees_its_history_and_others_do_not():
    _decided(1)
    for role in ("operator", "support", "admin"):
        client = _browser(role)
        assert client.get("/approvals/?status=decided").status_code == 200
        assert client.get("/unresolved/?status=resolved").status_code == 200
    anonymous = Client()
    response = anonymous.get("/approvals/?status=decided")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_time_filter_reads_days_minutes_and_zones():
    parse = history.parse_when
    assert parse("2026-12-04", end=False) == datetime(2026, 12, 4, tzinfo=UTC)
    assert parse("2026-12-04", end=True) == datetime(2026, 12, 5, tzinfo=UTC)
    assert parse("2026-12-04T14:05", end=True) == datetime(2026, 12, 4, 14, 6, tzinfo=UTC)
    assert parse("2026-12-04 14:05:30", end=True) == datetime(2026, 12, 4, 14, 5, 30, tzinfo=UTC)
    assert parse("2026-12-04T14:05+01:00", end=False) == datetime(2026, 12, 4, 13, 5, tzinfo=UTC)
    for bad in (
        "",
        "today",
        "2026-12",
        "04/12/2026",
        "2026-12-04T14",
        "20261204",
        "2026-W49-5",
    ):
        with pytest.raises(ValueError):
            parse(bad, end=False)
    assert Operation.objects.count() == 0  # pure


def test_the_history_names_both_approvers_of_a_two_person_request():
    owner = factories.agent()
    alice, bob = factories.console_user("operator"), factories.console_user("operator")
    op = factories.operation(
        owner,
        factories.task(owner, "pay big"),
        tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 200000},
    )
    approval = Approval.objects.get(operation=op)
    for who in (alice, bob):
        approval_decide(
            who.actor, approval.pk, decision="approve", reason="", params_hash=op.params_hash
        )
    browser = _browser("operator")
    body = browser.get("/approvals/?status=decided").content.decode()
    assert f"{alice.actor.label}, {bob.actor.label}" in body
    # The operation's page says it too, with the count.
    page = browser.get(f"/operations/{op.pk}/").content.decode()
    assert f"2 of 2 approvals: {alice.actor.label}, {bob.actor.label}" in page
