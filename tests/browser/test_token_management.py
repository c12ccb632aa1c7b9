"""Admins manage API tokens in the console: create one (shown once, kept as a digest), see it
listed, revoke it; the revoked token fails on its next request. Non-admins are refused."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from playwright.sync_api import Page, expect

from runtime.models import ApiToken, AuditRecord
from tests import factories
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_an_admin_creates_sees_once_and_revokes_a_token(page: Page, server):
    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    page.goto(f"{server.url}/tokens/")
    page.get_by_label("Agent name or username").fill("invoice-bot")
    page.get_by_label("Token name (optional)").fill("invoices <b>prod</b>")
    page.get_by_role("button", name="Create token").click()

    secret = page.locator("#issued-secret").inner_text().strip()
    assert secret.startswith("ac_")
    token = ApiToken.objects.get(name="invoices <b>prod</b>")
    # Kept only as a digest; the page said it once and the page is never cached.
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in token.digest
    row = page.locator(f'tr[data-token="{token.pk}"]')
    expect(row).to_contain_text("agent:invoice-bot")
    expect(row).to_contain_text(token.prefix)
    expect(row).to_contain_text(admin.actor.label)
    expect(row).to_contain_text("invoices <b>prod</b>")  # as text, not markup

    api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {secret}"})
    assert api.get("/api/v1/tasks").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None
    page.goto(f"{server.url}/tokens/")
    expect(page.locator("#issued-secret")).to_have_count(0)  # never shown again
    expect(row).to_contain_text("agent:invoice-bot")

    page.once("dialog", lambda dialog: dialog.accept())  # revoking asks first
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("ul.messages")).to_contain_text("revoked")
    expect(page.locator(f'tr[data-token="{token.pk}"]')).to_contain_text(f"by {admin.actor.label}")
    refused = api.get("/api/v1/tasks")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "not_authenticated"
    audit = list(AuditRecord.objects.filter(subject=f"token:{token.pk}").order_by("id"))
    assert [(a.action, a.actor) for a in audit] == [
        ("token.issued", admin.actor.label),
        ("token.revoked", admin.actor.label),
    ]


@pytest.mark.parametrize("role", ["operator", "support"])
def test_a_non_admin_is_refused_the_token_page(page: Page, server, role):
    person = factories.console_user(role)
    login(page, server.url, person.actor.name)
    response = page.goto(f"{server.url}/tokens/")
    assert response is not None and response.status == 403
    expect(page.get_by_role("button", name="Create token")).to_have_count(0)
    expect(page.locator("nav a", has_text="Tokens")).to_have_count(0)
