"""The console's one place where a webhook URL is entered (/settings/notifications/endpoints,
admins only; the REST API has no such route): a malformed URL (bad port, broken IPv6 literal,
control characters or spaces) or an IP literal the address guard refuses is answered 400 with
the contract's code and a message naming ``url``, and nothing is stored. A malformed URL from
the environment does not break the settings page. Both databases."""

from __future__ import annotations

import html

import pytest
from django.test import Client
from django.test.utils import override_settings

from runtime.models import AuditRecord, NotificationEndpoint
from tests import factories
from tests.runtime.test_webhook_address_guard import BAD_URLS, REFUSED_LITERAL_URLS

pytestmark = pytest.mark.django_db

ADD = "/settings/notifications/endpoints"


def _admin_browser() -> Client:
    browser = Client()
    browser.force_login(factories.console_user("admin").actor_user())
    return browser


@pytest.mark.parametrize("url", BAD_URLS + REFUSED_LITERAL_URLS)
def test_a_bad_or_refused_webhook_url_is_a_400_page_and_nothing_is_stored(url):
    answer = _admin_browser().post(ADD, {"name": "hook", "url": url, "format": "webhook"})
    assert answer.status_code == 400, answer.content[-2000:]
    assert answer["Content-Type"].startswith("text/html")
    text = html.unescape(answer.content.decode())
    assert "<code>invalid_input</code>" in text
    assert "url" in text.split('class="error">', 1)[1].split("<code>", 1)[0]
    assert not NotificationEndpoint.objects.exists()
    assert not AuditRecord.objects.filter(action="endpoint.added").exists()


def test_a_good_webhook_url_is_added():
    answer = _admin_browser().post(
        ADD, {"name": "hook", "url": "https://[2606:4700::1111]:8443/h", "format": "slack"}
    )
    assert answer.status_code == 200, answer.content[-2000:]
    assert NotificationEndpoint.objects.get().url_hint == "https://[2606:4700::1111]:8443/…"


@pytest.mark.parametrize("url", ["http://h:99999/", "http://h:abc/", "http://[::1/"])
def test_a_malformed_url_from_the_environment_still_shows_the_settings_page(url):
    with override_settings(NOTIFY_WEBHOOK_URL=url, NOTIFY_SLACK_WEBHOOK_URL=url):
        answer = _admin_browser().get("/settings/notifications/")
    assert answer.status_code == 200, answer.content[-2000:]
    assert "(not a valid URL)" in answer.content.decode()
