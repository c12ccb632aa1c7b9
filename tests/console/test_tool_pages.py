"""Declaring tools in the console (/tools/, issue 36 point 2): an admin declares an HTTP tool with
the form and edits it into a new version (the credential kept when left empty); operators and
support staff see the catalogue but neither the declarations nor the form, and a post of theirs
is the 403 page with nothing stored; the address guard's refusal comes back on the form as
typed (never the credential). Both databases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from runtime.models import AuditRecord, DeclaredTool, DeclaredToolVersion
from runtime.tools.declared import declarations_forget, secret_open
from tests import factories

pytestmark = pytest.mark.django_db

SECRET = "form-secret-value"


@pytest.fixture(autouse=True)
def _declarations_forgotten() -> Iterator[None]:
    declarations_forget()
    yield
    declarations_forget()


def _browser(role: str) -> tuple[Client, Any]:
    person = factories.console_user(role)
    browser = Client()
    browser.force_login(person.actor_user())
    return browser, person


def _form(**changes: str) -> dict[str, str]:
    form = {
        "name": "acme.billing.send_invoice",
        "kind": "http",
        "contract": "replay",
        "description": "Sends an invoice.",
        "params_schema": '{"type": "object", "properties": {"amount_cents": {"type": "integer"}}}',
        "approval_required": "conditional",
        "approval_param": "amount_cents",
        "approval_above": "50000",
        "approver_role": "operator",
        "approval_timeout_seconds": "",
        "max_attempts": "",
        "tool_class": "",
        "url": "https://billing.example.com/invoices",
        "method": "POST",
        "idempotency_header": "",
        "timeout_seconds": "",
        "lookup_url": "",
        "auth_type": "header",
        "auth_header": "X-Api-Key",
        "auth_secret": SECRET,
    }
    return {**form, **changes}


def test_an_admin_declares_a_tool_with_the_form_and_edits_it_into_a_new_version():
    browser, admin = _browser("admin")
    page = browser.get("/tools/").content.decode()
    assert 'id="declare-form"' in page and 'id="declared-tools"' in page

    answer = browser.post("/tools/declared", _form())
    assert answer.status_code == 302 and answer["Location"] == (
        "/tools/declared/acme.billing.send_invoice/"
    )
    row = DeclaredToolVersion.objects.get(tool_id="acme.billing.send_invoice")
    assert row.definition["idempotency_header"] == "Idempotency-Key"  # the default
    assert row.definition["approval"] == {
        "required": "conditional",
        "approver_role": "operator",
        "timeout_seconds": 3600,
        "param": "amount_cents",
        "above": 50000,
    }
    assert secret_open(row.secret_sealed) == SECRET
    assert AuditRecord.objects.filter(action="tool.declared", actor=admin.actor.label).exists()

    detail = browser.get("/tools/declared/acme.billing.send_invoice/").content.decode()
    assert "X-Api-Key" in detail and "set, sealed" in detail and SECRET not in detail
    catalogue = browser.get("/tools/").content.decode()
    assert 'data-tool="acme.billing.send_invoice"' in catalogue
    assert "amount_cents above 50000" in catalogue

    edited = browser.post(
        "/tools/declared/acme.billing.send_invoice/edit",
        {
            **_form(auth_secret="", url="https://billing.example.com/v2/invoices"),
            "version": "1",
            "offered": "1",
        },
        follow=True,
    )
    assert "is now version 2" in edited.content.decode()
    v2 = DeclaredToolVersion.objects.get(tool_id="acme.billing.send_invoice", version=2)
    assert v2.definition["url"] == "https://billing.example.com/v2/invoices"
    assert secret_open(v2.secret_sealed) == SECRET  # left empty: kept


@pytest.mark.parametrize("role", ["operator", "support"])
def test_other_roles_read_the_catalogue_but_may_not_declare_nor_edit(role):
    browser, _ = _browser(role)
    page = browser.get("/tools/")
    assert page.status_code == 200
    assert 'id="declare-form"' not in page.content.decode()
    assert browser.post("/tools/declared", _form()).status_code == 403
    assert not DeclaredTool.objects.exists()

    admin = factories.console_user("admin")
    created = admin.client().post(
        "/api/v1/tools/declared",
        {
            "name": "acme.x",
            "kind": "agent",
            "contract": "none",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert browser.get("/tools/declared/acme.x/").status_code == 403
    edit = browser.post(
        "/tools/declared/acme.x/edit", {"description": "mine", "version": "1", "offered": "1"}
    )
    assert edit.status_code == 403
    assert DeclaredToolVersion.objects.filter(tool_id="acme.x").count() == 1


def test_a_private_address_is_refused_on_the_form_as_typed_without_the_secret():
    browser, _ = _browser("admin")
    answer = browser.post("/tools/declared", _form(url="http://10.0.0.7/invoices"))
    assert answer.status_code == 400
    page = answer.content.decode()
    assert "Nothing was declared" in page and "TOOL_ALLOW_PRIVATE_HOSTS" in page
    assert 'value="http://10.0.0.7/invoices"' in page and SECRET not in page
    assert not DeclaredTool.objects.exists()


def test_an_admin_sets_a_two_person_rule_with_the_form_and_a_bad_one_is_refused():
    browser, _ = _browser("admin")
    refused = browser.post(
        "/tools/declared", _form(approvers="2", approvers_param="nothing", approvers_above="9")
    )
    assert refused.status_code == 400
    assert "approval.approvers_param must name a parameter" in refused.content.decode()
    assert not DeclaredTool.objects.exists()

    answer = browser.post(
        "/tools/declared",
        _form(approvers="2", approvers_param="amount_cents", approvers_above="500000"),
    )
    assert answer.status_code == 302, answer.content[:500]
    row = DeclaredToolVersion.objects.get(tool_id="acme.billing.send_invoice")
    assert row.definition["approval"]["approvers"] == 2
    assert row.definition["approval"]["approvers_param"] == "amount_cents"
    assert row.definition["approval"]["approvers_above"] == 500000
    catalogue = browser.get("/tools/").content.decode()
    assert "2 distinct approvers when amount_cents above 500000" in catalogue
    detail = browser.get("/tools/declared/acme.billing.send_invoice/").content.decode()
    assert 'name="approvers" type="number" min="1" max="5" value="2"' in detail
