"""The human side's pages without a browser: who sees what, CSRF on every form, escaped text,
the bulk form's per-item results, the waits page's admin actions, the dashboard's panel."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runtime.approval_expiry import approval_expire_sweep
from runtime.models import Approval, Operation, Task
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

HOSTILE = '<img src=x onerror="window.__xss=1">'


def _browser(role: str, csrf: bool = False) -> tuple[Client, factories.Principal]:
    person = factories.console_user(role)
    client = Client(enforce_csrf_checks=csrf)
    assert client.login(username=person.actor.name, password=factories.PASSWORD)
    return client, person


def _gated(owner, amount=25000, account="acct-1"):
    task = factories.task(owner, name="pay supplier")
    op = factories.operation(
        owner,
        task,
        tool="demo.payments.charge",
        params={"account": account, "amount_cents": amount},
    )
    return task, op, Approval.objects.get(operation=op)


def test_the_approvals_page_shows_what_will_be_done_and_escapes_it():
    owner = factories.agent()
    _, op, approval = _gated(owner, account=HOSTILE)
    client, _ = _browser("operator")
    page = client.get("/approvals/").content.decode()
    assert approval.pk in page and "demo.payments.charge" in page
    assert "250.00" in page and owner.actor.label in page
    assert HOSTILE not in page and "&lt;img" in page
    assert 'name="csrfmiddlewaretoken"' in page
    # Filters by tool and task.
    assert approval.pk not in client.get("/approvals/?tool=demo.echo").content.decode()
    assert approval.pk in client.get(f"/approvals/?task={op.task_id}").content.decode()
    assert approval.pk not in client.get("/approvals/?task=tsk_other").content.decode()


def test_support_sees_requests_but_no_decision_controls_and_cannot_post_one():
    owner = factories.agent()
    _, op, approval = _gated(owner)
    client, _ = _browser("support")
    page = client.get("/approvals/").content.decode()
    assert approval.pk in page and "Approve selected" not in page
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "params_hash": approval.params_hash},
    )
    assert response.status_code == 403
    op.refresh_from_db()
    assert op.status == "waiting_approval"


def test_decisions_need_the_csrf_token():
    owner = factories.agent()
    _, op, approval = _gated(owner)
    client, _ = _browser("operator", csrf=True)
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "params_hash": approval.params_hash},
    )
    # Refused: nothing decided, and the person is sent back to the inbox, at the request, told so.
    assert (response.status_code, response["Location"]) == (
        303,
        f"/approvals/#request-{approval.pk}",
    )
    assert "was NOT taken" in client.get("/approvals/").content.decode()
    op.refresh_from_db()
    assert op.status == "waiting_approval"


def test_bulk_approval_reports_each_item_and_a_stale_one_fails_alone():
    owner = factories.agent()
    _, op1, a1 = _gated(owner, account="one")
    _, op2, a2 = _gated(owner, account="two")
    client, _ = _browser("operator")
    response = client.post(
        "/approvals/bulk",
        {"decision": "approve", "selected": [f"{a1.pk}|{a1.params_hash}", f"{a2.pk}|stale"]},
        follow=True,
    )
    page = response.content.decode()
    assert f"Request {a1.pk} is approved: its action runs now." in page
    assert f"Nothing was decided on {a2.pk}: its parameters changed since you looked" in page
    assert Operation.objects.get(pk=op1.pk).status == "pending"
    assert Operation.objects.get(pk=op2.pk).status == "waiting_approval"


def test_an_edit_from_the_page_shows_the_diff_and_the_editor_cannot_approve_it():
    owner = factories.agent()
    _, op, approval = _gated(owner)
    client, _ = _browser("operator")
    client.post(
        f"/approvals/{approval.pk}/edit",
        {"params": '{"account": "acct-1", "amount_cents": 12000}', "reason": "lower"},
    )
    new = Approval.objects.get(operation=op, status="pending")
    assert new.proposal_version == 2
    page = client.get("/approvals/").content.decode()
    assert 'data-diff="amount_cents"' in page and "25000" in page and "12000" in page
    response = client.post(
        f"/approvals/{new.pk}/decide",
        {"decision": "approve", "params_hash": new.params_hash},
    )
    assert "You may not decide it: the editor of a proposal may not approve it." in page
    # A missing right is a 403 page (as on every console form), not a flash message.
    assert response.status_code == 403
    assert Approval.objects.get(pk=new.pk).status == "pending"
    bad = client.post(f"/approvals/{new.pk}/edit", {"params": "not json"}, follow=True)
    assert "not valid JSON" in bad.content.decode()


def test_the_waits_page_lists_expired_waits_and_only_admins_act():
    owner = factories.agent()
    task, op, approval = _gated(owner)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    approval_expire_sweep()
    operator, _ = _browser("operator")
    assert op.pk in operator.get("/waits/").content.decode()
    assert "Renew" not in operator.get("/waits/").content.decode()
    refused = operator.post(f"/waits/{op.pk}/act", {"action": "renew", "expires_in_seconds": "60"})
    assert refused.status_code == 403
    assert Operation.objects.get(pk=op.pk).status == "expired"
    admin, _ = _browser("admin")
    assert "Renew" in admin.get("/waits/").content.decode()
    admin.post(f"/waits/{op.pk}/act", {"action": "end", "reason": "too late"})
    task.refresh_from_db()
    assert task.outcome == "cancelled"
    assert Operation.objects.get(pk=op.pk).status == "cancelled"
    assert Approval.objects.get(pk=approval.pk).status == "denied"


def test_the_task_page_shows_approvals_waits_signals_and_controls_for_allowed_roles():
    owner = factories.agent()
    task, _, approval = _gated(owner)
    factories.operation(owner, task, kind="wait_signal", tool="", signal="go")
    owner.client().post(
        f"/api/v1/tasks/{task.pk}/signals", {"event_id": "e-1", "name": "go"}, format="json"
    )
    operator, _ = _browser("operator")
    page = operator.get(f"/tasks/{task.pk}/").content.decode()
    assert approval.pk in page and 'data-signal="e-1"' in page and "delivered" in page
    assert ">Pause</button>" in page
    operator.post(f"/tasks/{task.pk}/control", {"action": "steer", "direction": HOSTILE})
    operator.post(f"/tasks/{task.pk}/control", {"action": "pause"})
    task = Task.objects.get(pk=task.pk)
    assert task.paused and task.direction == HOSTILE
    page = operator.get(f"/tasks/{task.pk}/").content.decode()
    assert ">Resume</button>" in page and HOSTILE not in page
    support, _ = _browser("support")
    assert ">Resume</button>" not in support.get(f"/tasks/{task.pk}/").content.decode()
    support.post(f"/tasks/{task.pk}/control", {"action": "resume"})
    assert Task.objects.get(pk=task.pk).paused


def test_the_dashboard_panel_counts_what_needs_a_person():
    owner = factories.agent()
    _gated(owner)
    client, _ = _browser("support")
    page = client.get("/").content.decode()
    assert "Needs a person" in page
    assert '<a href="/approvals/" data-need="approvals"><span class="count">1</span>' in page
    assert '<a href="/waits/" data-need="waits"><span class="count">0</span>' in page


def test_unstorable_text_in_a_form_is_a_4xx_page_and_changes_nothing():
    owner = factories.agent()
    task, op, approval = _gated(owner)
    client, _ = _browser("operator")
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "deny", "reason": "bad\x00", "params_hash": approval.params_hash},
    )
    assert response.status_code == 400
    edit = client.post(
        f"/approvals/{approval.pk}/edit",
        {"params": '{"account": "a\\u0000", "amount_cents": 5}'},
        follow=True,
    )
    assert edit.status_code == 200 and "not allowed" in edit.content.decode()
    steer = client.post(f"/tasks/{task.pk}/control", {"action": "steer", "direction": "x\x00"})
    assert steer.status_code == 400
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert Operation.objects.get(pk=op.pk).status == "waiting_approval"
    assert Task.objects.get(pk=task.pk).direction == ""
