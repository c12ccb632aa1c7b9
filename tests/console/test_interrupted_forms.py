"""Every console form sent signed out leads, after the login, back to the page it was on (never to
a GET of the form's URL, a 405), marked so the login says it was NOT taken; the Referer is used
only when it is one of this console's pages. The browser journey is in
tests/browser/test_no_decision_lost.py."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client, RequestFactory

from console.web.interrupted import login_next
from tests import factories

FORMS = {
    "/approvals/apr_1/decide": "/approvals/",
    "/approvals/apr_1/edit": "/approvals/",
    "/approvals/bulk": "/approvals/",
    "/unresolved/op_1/resolve": "/unresolved/",
    "/waits/op_1/act": "/waits/",
    "/tasks/tsk_1/cancel": "/tasks/tsk_1/",
    "/tasks/tsk_1/control": "/tasks/tsk_1/",
    "/tokens/": "/tokens/",
    "/tokens/tok_1/revoke": "/tokens/",
}


def _next(location: str) -> tuple[str, dict[str, list[str]]]:
    target = parse_qs(urlsplit(location).query)["next"][0]
    parts = urlsplit(target)
    return parts.path, parse_qs(parts.query)


@pytest.mark.parametrize("form", list(FORMS))
def test_a_form_sent_signed_out_goes_back_to_its_page_after_the_login(form: str):
    request = RequestFactory().post(form, {"decision": "approve"})
    path, query = _next("/login/?next=" + login_next(request))
    assert path == FORMS[form]
    assert query["not_taken"] == [form]


def test_the_referer_is_used_when_it_is_one_of_our_pages_only():
    factory = RequestFactory()
    own = factory.post(
        "/approvals/apr_1/decide", HTTP_REFERER="http://testserver/approvals/?tool=demo.x"
    )
    assert login_next(own).startswith("/approvals/?tool=demo.x&not_taken=")
    for referer in (
        "http://evil.example/approvals/",
        "http://testserver/login/",
        "http://testserver/approvals/apr_1/decide",
        "javascript:alert(1)",
    ):
        request = factory.post("/approvals/apr_1/decide", HTTP_REFERER=referer)
        assert login_next(request).startswith("/approvals/?not_taken="), referer


@pytest.mark.django_db
def test_the_login_turns_the_mark_into_a_message_and_drops_it():
    person = factories.console_user("operator")
    client = Client()
    anonymous = client.post("/waits/op_1/act", {"action": "end"})
    assert anonymous.status_code == 302
    login_page = client.get(anonymous["Location"])
    assert login_page.status_code == 200
    logged_in = client.post(
        "/login/",
        {
            "username": person.actor.name,
            "password": factories.PASSWORD,
            "next": login_page.context["next"],
        },
    )
    assert (logged_in.status_code, logged_in["Location"]) == (302, "/waits/")
    page = client.get("/waits/").content.decode()
    said = "You were signed out before it arrived, so your action on the expired wait op_1"
    assert f"{said} was NOT taken." in page
