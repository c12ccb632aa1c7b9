"""/tokens/ shows every name, label and free text as a person must read it: a character that
hides or reorders text (U+202E, U+200B, ...) appears as a marked ``<U+202E>``, never raw, in the
list, the revoke confirmation, the revoke message, the page of a token just created and the
signed-in person's name in the header. New agent
and token names refuse such characters (runtime.text.name_check, the rule for every name); names
stored before that rule, and usernames, are still shown marked."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from runtime.models import Agent, ApiToken, AuditRecord
from runtime.tokens import token_issue_txn
from tests import factories

pytestmark = pytest.mark.django_db

RLO, ZWSP = "\u202e", "\u200b"
SPOOF = f"pay{RLO}lortnoc{ZWSP}bot"
MARK_RLO = '<span class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE">&lt;U+202E&gt;</span>'
MARK_ZWSP = '<span class="hidden-char" title="U+200B ZERO WIDTH SPACE">&lt;U+200B&gt;</span>'


def _admin_session(username: str | None = None) -> APIClient:
    admin = factories.console_user("admin")
    user = admin.actor_user()
    if username is not None:
        # A username stored with hidden characters (console users are made elsewhere).
        get_user_model().objects.filter(pk=user.pk).update(username=username)
        user.refresh_from_db()
    client = APIClient()
    client.force_login(user)
    return client


def _assert_marked(page: str) -> None:
    assert RLO not in page and ZWSP not in page, "a hidden character is shown raw"
    assert MARK_RLO in page and MARK_ZWSP in page, "the hidden characters are not marked"


def test_names_stored_with_hidden_characters_are_marked_on_the_token_list():
    # As stored before names refused them: the agent, the token name and both actor labels.
    agent = Agent.objects.create(name=SPOOF)
    token = token_issue_txn(
        name=f"t{RLO}{ZWSP}",
        created_by=f"user:{SPOOF}",
        minted_by="user:1",
        acts_as=f"agent:{SPOOF}",
        agent=agent,
    ).token
    client = _admin_session()
    page = client.get("/tokens/").content.decode()
    _assert_marked(page)
    row = re.search(rf'<tr data-token="{token.pk}">.*?</tr>', page, re.S)
    assert row is not None
    cells = row.group(0)
    assert f"agent:pay{MARK_RLO}lortnoc{MARK_ZWSP}bot" in cells  # acts as
    assert f"user:pay{MARK_RLO}lortnoc{MARK_ZWSP}bot" in cells  # minted by
    # The revoke confirmation takes no markup: the marks as text, escaped in the attribute.
    assert "Revoke the token 't&lt;U+202E&gt;&lt;U+200B&gt;'" in cells
    assert "acting as agent:pay&lt;U+202E&gt;lortnoc&lt;U+200B&gt;bot?" in cells

    # Revoked by a label with hidden characters: the state column marks it; so does the message.
    revoked = client.post(f"/tokens/{token.pk}/revoke", {}, format="multipart", follow=True)
    assert revoked.status_code == 200
    page = revoked.content.decode()
    assert RLO not in page and ZWSP not in page
    assert f"The token &#x27;t{MARK_RLO}{MARK_ZWSP}&#x27;" in page  # the revoke message
    ApiToken.objects.filter(pk=token.pk).update(revoked_by=f"user:{SPOOF}")
    page = client.get("/tokens/").content.decode()
    _assert_marked(page)
    assert f"by user:pay{MARK_RLO}lortnoc{MARK_ZWSP}bot" in page


def test_the_created_token_page_marks_its_subject():
    """A person whose username holds hidden characters mints a token for themself: the page
    that shows it once names whom it acts as, marked (its default name holds the username)."""
    client = _admin_session(username=SPOOF)
    response = client.post(
        "/tokens/", {"kind": "user", "subject": SPOOF, "name": ""}, format="multipart"
    )
    assert response.status_code == 200, response.content[:500]
    page = response.content.decode()
    issued = re.search(r'<section class="card" id="issued-token">.*?</section>', page, re.S)
    assert issued is not None
    card = issued.group(0)
    assert RLO not in card and ZWSP not in card
    assert f"New token: pay{MARK_RLO}lortnoc{MARK_ZWSP}bot script" in card
    assert f"Acts as user:pay{MARK_RLO}lortnoc{MARK_ZWSP}bot." in card
    _assert_marked(page)


def test_a_new_agent_or_token_name_with_hidden_characters_is_refused():
    client = _admin_session()
    before = (ApiToken.objects.count(), Agent.objects.count(), AuditRecord.objects.count())
    for subject, name, said in (
        (SPOOF, "", "agent name must not contain"),
        ("plain-bot", f"n{ZWSP}", "token name must not contain"),
    ):
        response = client.post(
            "/tokens/", {"kind": "agent", "subject": subject, "name": name}, format="multipart"
        )
        assert response.status_code == 400, response.content[:500]
        page = response.content.decode()
        assert said in page and RLO not in page and ZWSP not in page
    with pytest.raises(CommandError, match=r"agent name .*U\+202E"):
        call_command("create_agent_token", SPOOF)
    after = (ApiToken.objects.count(), Agent.objects.count(), AuditRecord.objects.count())
    assert after == before, "a refused name created something"
    # The same form with a plain name mints.
    ok = client.post(
        "/tokens/", {"kind": "agent", "subject": "plain-bot", "name": ""}, format="multipart"
    )
    assert ok.status_code == 200 and 'id="issued-secret"' in ok.content.decode()
