"""The task list filters by when a task was created and by a parameter value its work carries,
and a person keeps filters as named views (issue 39: "filters by time range and parameter
values, saved as views"). Runs on both databases: the parameter filter reads a JSON key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runtime.errors import InvalidInput
from runtime.models import SavedView, Task
from runtime.saved_views import view_query
from tests import factories

pytestmark = pytest.mark.django_db


def _browser(role: str = "operator") -> tuple[Client, factories.Principal]:
    person = factories.console_user(role)
    client = Client()
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client, person


def _listed(client: Client, query: str) -> str:
    response = client.get(f"/tasks/?{query}")
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


def test_the_list_filters_by_a_parameter_value_and_by_the_day_it_was_created():
    owner = factories.agent()
    first = factories.task(owner, "refund acct-1042")
    factories.operation(owner, first, params={"account": "acct-1042", "amount_cents": 250})
    other = factories.task(owner, "refund acct-7")
    factories.operation(owner, other, params={"account": "acct-7", "amount_cents": 250})
    old = factories.task(owner, "last month's")
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=30))
    client, _ = _browser()

    page = _listed(client, "param=account%3Dacct-1042")
    assert first.pk in page and other.pk not in page and old.pk not in page
    page = _listed(client, "param=amount_cents%3D250")  # a number, typed as text
    assert first.pk in page and other.pk in page
    today = timezone.now().date().isoformat()
    page = _listed(client, f"since={today}&until={today}")
    assert first.pk in page and other.pk in page and old.pk not in page
    month_ago = (timezone.now() - timedelta(days=30)).date().isoformat()
    page = _listed(client, f"until={month_ago}")
    assert old.pk in page and first.pk not in page


@pytest.mark.parametrize(
    "query",
    ["since=yesterday", "until=2026-13-01", "param=account", "param=a__b%3Dx", "param=%3Dx"],
)
def test_a_filter_that_cannot_be_read_is_a_clear_400(query):
    client, _ = _browser()
    response = client.get(f"/tasks/?{query}")
    assert response.status_code == 400
    assert "filter" in response.content.decode() or "date" in response.content.decode()


def test_a_person_saves_filters_as_a_view_opens_it_and_removes_it():
    owner = factories.agent()
    factories.task(owner, "one")
    client, person = _browser("support")
    page = _listed(client, "outcome=failed&param=account%3Dacct-1")
    assert 'id="save-view-form"' in page
    saved = client.post(
        "/tasks/views",
        {"name": "failed for acct-1", "query": "outcome=failed&param=account%3Dacct-1&x=1"},
    )
    assert saved.status_code == 302
    view = SavedView.objects.get(user_id=person.actor.user_id)
    # Only the list's own filters, in a stable order: no cursor, nothing foreign.
    assert view.query == "outcome=failed&param=account%3Dacct-1"
    assert saved["Location"] == f"/tasks/?{view.query}"
    page = _listed(client, "")
    shown = view.query.replace("&", "&amp;")  # as the page escapes it
    assert 'data-view="failed for acct-1"' in page and f'href="/tasks/?{shown}"' in page

    again = client.post("/tasks/views", {"name": "failed for acct-1", "query": "outcome=failed"})
    assert again.status_code == 409
    assert SavedView.objects.count() == 1

    someone_else, _ = _browser("admin")
    assert 'data-view="failed for acct-1"' not in _listed(someone_else, "")
    assert someone_else.post(f"/tasks/views/{view.pk}/remove").status_code == 404
    assert SavedView.objects.filter(pk=view.pk).exists()

    assert client.post(f"/tasks/views/{view.pk}/remove").status_code == 302
    assert not SavedView.objects.exists()


def test_a_view_of_everything_or_with_an_over_long_name_is_refused_and_nothing_is_kept():
    client, _ = _browser()
    assert 'id="save-view-form"' not in _listed(client, "")
    assert client.post("/tasks/views", {"name": "all", "query": "before=x"}).status_code == 400
    assert client.post("/tasks/views", {"name": "x" * 81, "query": "q=a"}).status_code == 400
    assert client.post("/tasks/views", {"name": "  ", "query": "q=a"}).status_code == 400
    assert not SavedView.objects.exists()


def test_view_query_keeps_the_pages_filters_in_order():
    assert view_query("tasks", "param=a%3D1&q=x&cursor=9&outcome=") == "q=x&param=a%3D1"
    with pytest.raises(InvalidInput):
        view_query("nowhere", "q=x")
