"""The Django admin (``/admin/``): every model is listed for an admin, in a bounded number of
statements whatever the rows; nothing can be added, changed or deleted there; only admins get
in; a row is found by its id or by an id it points at."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console.admin import admin_site
from runtime.models import Approval, Event, Operation, Task
from tests import factories

pytestmark = [pytest.mark.django_db]


def _world() -> Task:
    """Rows in most tables: a task with a budget, operations run (invocations, events, usage,
    holds), a gated charge waiting for approval, an unresolved notification."""
    owner = factories.agent()
    task = factories.task(owner, budget={"cost_cents": 1000})
    for n in range(3):
        factories.operation(owner, task, step=f"echo-{n}", estimate={"cost_cents": 1})
    factories.operation(
        owner, task, step="pay big", tool="demo.payments.charge",
        params={"account": "a", "amount_cents": 25000},
    )  # fmt: skip
    factories.run_claimable(task.pk)
    return task


def _signed_in(role: str) -> Client:
    client = Client()
    client.force_login(factories.console_user(role).actor_user())
    return client


def test_an_admin_lists_every_model_in_bounded_statements():
    _world()
    client = _signed_in("admin")
    assert client.get("/admin/").status_code == 200
    counts = {}
    for model in admin_site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        counts[model._meta.label] = len(queries)
    # The same few statements for every table (the session, the user and its roles for the
    # gate and the navigation, the page's rows and their count): none per row shown.
    assert max(counts.values()) <= 15, counts
    url = reverse("admin:runtime_event_changelist")
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    owner = factories.agent()
    task = factories.task(owner)
    for n in range(10):
        factories.operation(owner, task, step=f"more-{n}")
    factories.run_claimable(task.pk)
    with CaptureQueriesContext(connection) as many:
        page = client.get(url)
    assert page.content.count(b"<tr") > 30
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
    # Rows exist where it matters, so the bound is not met on empty tables only.
    assert Event.objects.count() > 5 and Operation.objects.count() >= 4
    op = Operation.objects.first()
    assert op is not None
    page = client.get(reverse("admin:runtime_operation_change", args=[op.pk]))
    assert page.status_code == 200
    assert op.pk.encode() in page.content
    assert b"lease_token_digest" not in page.content


def test_nothing_is_added_changed_or_deleted_in_the_admin():
    task = _world()
    client = _signed_in("admin")
    op = Operation.objects.filter(task=task).first()
    assert op is not None
    before = (op.status, op.state_version, op.params)
    change = reverse("admin:runtime_operation_change", args=[op.pk])
    assert client.post(change, {"status": "succeeded", "params": "{}"}).status_code == 403
    assert client.post(reverse("admin:runtime_operation_add"), {"step": "x"}).status_code == 403
    delete = reverse("admin:runtime_operation_delete", args=[op.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    bulk = client.post(
        reverse("admin:runtime_task_changelist"),
        {"action": "delete_selected", "_selected_action": [task.pk], "post": "yes"},
    )
    assert bulk.status_code in (200, 302, 400, 403)
    op.refresh_from_db()
    assert (op.status, op.state_version, op.params) == before
    assert Task.objects.filter(pk=task.pk).exists()
    assert Operation.objects.filter(pk=op.pk).exists()
    page = client.get(change)
    assert b'name="_save"' not in page.content


def test_only_admins_enter():
    anonymous = Client().get("/admin/runtime/operation/")
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/login/")
    assert Client().get("/admin/login/").status_code == 302
    for role in ("operator", "support"):
        client = _signed_in(role)
        assert client.get("/admin/").status_code == 403
        assert client.get("/admin/runtime/operation/").status_code == 403
    # A token is nobody here: the admin knows only sessions.
    admin = factories.console_user("admin")
    response = Client().get("/admin/", HTTP_AUTHORIZATION=f"Bearer {admin.token}")
    assert response.status_code == 302


def test_a_row_is_found_by_its_id_or_one_it_points_at():
    task = _world()
    client = _signed_in("admin")
    op = Operation.objects.filter(task=task, tool="demo.payments.charge").get()
    approval = Approval.objects.get(operation=op)
    ops = client.get(reverse("admin:runtime_operation_changelist"), {"q": op.pk})
    assert ops.status_code == 200
    assert op.pk.encode() in ops.content
    others = Operation.objects.filter(task=task).exclude(pk=op.pk).values_list("pk", flat=True)
    assert not any(other.encode() in ops.content for other in others)
    by_task = client.get(reverse("admin:runtime_approval_changelist"), {"q": task.pk})
    assert approval.pk.encode() in by_task.content
    # An integer id searched with letters finds nothing, and fails nothing.
    events = client.get(reverse("admin:runtime_event_changelist"), {"q": "not-a-number"})
    assert events.status_code == 200
