"""Separation of duties survives token minting: a person mints a token only for themself or for
a NEW agent (never for another person, never for an existing agent), every token records its
minter, and an approval requested through a token is never decided by the person who minted it,
neither at the decision (403, over REST and on the console page) nor at release."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from runtime.approval_seal import approval_seal
from runtime.models import Agent, ApiToken, Approval, ApprovalVote, AuditRecord, Operation
from runtime.tokens import CLI
from runtime.transitions.claim import operation_claim
from runtime.transitions.claim_refusals import Refusal
from tests import factories
from tests.api.support import assert_error, post_json

pytestmark = pytest.mark.django_db


def _session(principal: factories.Principal) -> APIClient:
    client = APIClient()
    client.force_login(principal.actor_user())
    return client


def _mint(client: APIClient, kind: str, subject: str) -> tuple[int, str | None]:
    """POST the /tokens/ form; (status, the secret shown once or None)."""
    response = client.post(
        "/tokens/", {"kind": kind, "subject": subject, "name": "minted"}, format="multipart"
    )
    found = re.search(rb'<code id="issued-secret">([^<]+)</code>', response.content)
    return response.status_code, found.group(1).decode() if found else None


def _counts() -> tuple[int, int, int]:
    return ApiToken.objects.count(), Agent.objects.count(), AuditRecord.objects.count()


def test_an_admin_mints_for_no_other_person_and_no_existing_agent():
    admin, operator = factories.console_user("admin"), factories.console_user("operator")
    existing = factories.agent()
    client = _session(admin)
    before = _counts()
    assert _mint(client, "user", operator.actor.name) == (403, None)
    assert _mint(client, "agent", existing.actor.name) == (403, None)
    assert _counts() == before, "a refused mint created something"
    # Themself and a new agent: minted, and each token names its minter.
    status, own = _mint(client, "user", admin.actor.name)
    assert status == 200 and own
    status, bot = _mint(client, "agent", "brand-new-bot")
    assert status == 200 and bot
    minted = ApiToken.objects.filter(name="minted")
    assert {t.minted_by for t in minted} == {admin.actor.key}
    assert {t.created_by for t in minted} == {admin.actor.label}
    # The page names the minter of each token, and says so when it is unknown.
    ApiToken.objects.filter(pk=minted.first().pk).update(minted_by=None)
    page = client.get("/tokens/").content.decode()
    assert "unknown (minted before minters were recorded)" in page


def test_the_shell_still_mints_for_anyone_and_records_itself():
    operator = factories.console_user("operator")
    call_command("create_agent_token", "ops script", user=operator.actor.name)
    call_command("create_agent_token", "shell-agent")
    made = ApiToken.objects.filter(name__in=["ops script", "shell-agent"])
    assert made.count() == 2
    assert {t.minted_by for t in made} == {CLI}


def _gated_through(client: APIClient) -> Approval:
    """A task and a gated charge proposed over REST with ``client``'s token."""
    task = post_json(client, "/api/v1/tasks", {"name": "pay me"})
    assert task.status_code == 201, task.content
    op = post_json(
        client,
        f"/api/v1/tasks/{task.json()['id']}/operations",
        {
            "tool": "demo.payments.charge",
            "step": "pay",
            "params": {"account": "me", "amount_cents": 50000},
        },
    )
    assert op.status_code == 201, op.content
    return Approval.objects.get(operation_id=op.json()["id"])


def test_the_minter_of_the_requesting_token_may_not_approve_over_rest_or_the_page():
    admin, operator = factories.console_user("admin"), factories.console_user("operator")
    status, secret = _mint(_session(admin), "agent", "admins-own-bot")
    assert status == 200 and secret
    bot = APIClient()
    bot.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    approval = _gated_through(bot)
    assert approval.requester_minted_by == admin.actor.key
    decision = {"decision": "approve", "reason": "", "params_hash": approval.params_hash}
    url = f"/api/v1/approvals/{approval.pk}/decision"
    # Over REST, with the admin's own token and with the admin's session: 403, nothing decided.
    assert_error(post_json(admin.client(), url, decision), 403, "not_authorized")
    assert_error(post_json(_session(admin), url, decision), 403, "not_authorized")
    # On the console page: a 403 page.
    page = _session(admin).post(f"/approvals/{approval.pk}/decide", decision, format="multipart")
    assert page.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.decider_key == ""
    # Another operator decides it as usual.
    ok = post_json(operator.client(), url, decision)
    assert ok.status_code == 200 and ok.json()["status"] == "approved"


def test_the_minter_is_refused_at_release_too():
    """A decision recorded for the minter (written before this rule, or by any other path) does
    not release the work: the claim reopens the request for another approver."""
    admin = factories.console_user("admin")
    status, secret = _mint(_session(admin), "agent", "release-bot")
    assert status == 200 and secret
    bot = APIClient()
    bot.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    approval = _gated_through(bot)
    Approval.objects.filter(pk=approval.pk).update(
        status="approved", decided_by=admin.actor.label, decider_key=admin.actor.key
    )
    Operation.objects.filter(pk=approval.operation_id).update(status="pending")
    # Written before this rule: its vote as migration 0025 writes it from the decision, sealed
    # as migration 0014 seals every decided row it finds.
    ApprovalVote.objects.create(
        approval_id=approval.pk,
        approver=admin.actor.label,
        approver_key=admin.actor.key,
        voted_at=approval.created_at,
    )
    forged = Approval.objects.get(pk=approval.pk)
    stored = Operation.objects.get(pk=approval.operation_id).params
    seal = approval_seal(forged, approver=forged.decider_key, operation_params=stored)
    Approval.objects.filter(pk=approval.pk).update(seal=seal)
    claimed = operation_claim(approval.operation_id, execution_id="exe_release_test")
    assert isinstance(claimed, Refusal), claimed
    assert "minted" in claimed.reason
    assert Operation.objects.get(pk=approval.operation_id).status != "running"
    assert Approval.objects.get(pk=approval.pk).status != "released"
