"""The console under its Content-Security-Policy in Chromium: the headers are sent, every page
still works (the live layer connects, fragments refresh) with no violation reported, and a
page served from another port of the same host cannot open an operator's websocket even with
the operator's cookies in the browser."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

from console.middleware import CONTENT_SECURITY_POLICY, DOCS_CONTENT_SECURITY_POLICY
from runtime.models import Operation
from tests import factories
from tests.browser.conftest import login, poll, wait_live
from tests.conftest import free_port, journal_note

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + e.blockedURI);
});
"""


def _watch(page: Page) -> list[str]:
    messages: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            messages.append(message.text)

    page.on("console", on_console)
    page.add_init_script(RECORD_VIOLATIONS)
    return messages


def test_console_pages_send_the_policies_and_work_under_them(page: Page, server):
    owner = factories.agent()
    task = factories.task(owner, "under the policy")
    op = factories.operation(owner, task)
    Operation.objects.filter(pk=op.pk).update(status="unresolved")
    messages = _watch(page)
    admin = factories.console_user("admin")
    login(page, server.url, admin.actor.name)
    for path in ("/", "/tasks/", f"/tasks/{task.pk}/", "/unresolved/"):
        response = page.goto(f"{server.url}{path}")
        assert response is not None and response.status == 200
        headers = response.headers
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert "camera=()" in headers["permissions-policy"]
        # The live layer (static/console.js, started from data attributes) runs under it.
        wait_live(page)
        assert page.evaluate("window.__violations") == [], path

    # On the task page, a new journal event arrives over the websocket and the fragment is
    # re-fetched: script, websocket and fetch all allowed by 'self'.
    page.goto(f"{server.url}/tasks/{task.pk}/")
    wait_live(page)
    journal_note(task.pk, "seen live under the policy")
    expect(page.locator("#timeline li", has_text="seen live under the policy")).to_have_count(1)
    assert page.evaluate("window.__violations") == []
    assert [m for m in messages if "Content Security Policy" in m or "Permissions" in m] == []
    assert page.page_errors == []  # type: ignore[attr-defined]


def test_the_policy_blocks_inline_script_on_a_console_page(page: Page, server):
    messages = _watch(page)
    login(page, server.url, factories.console_user("operator").actor.name)
    # Markup that got into a page would be inline script: the browser refuses to run it.
    page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.__ran = 1'; document.body.appendChild(s); }"""
    )
    poll(page, lambda: page.evaluate("window.__violations.length") > 0, what="a violation")
    assert page.evaluate("typeof window.__ran") == "undefined"
    assert any("Content Security Policy" in m for m in messages)


def test_the_api_docs_page_works_under_the_policy(page: Page, server):
    # Swagger UI inserts style elements, so its page alone allows inline style; script stays
    # 'self' (drf-spectacular's split view serves the page's script from a URL).
    _watch(page)
    response = page.goto(f"{server.url}/api/docs/")
    assert response is not None
    assert response.headers["content-security-policy"] == DOCS_CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in DOCS_CONTENT_SECURITY_POLICY
    expect(page.get_by_text("Agent execution console API").first).to_be_visible()
    expect(page.locator(".opblock").first).to_be_visible()
    assert page.evaluate("window.__violations") == []


ATTACK = """<!doctype html><title>elsewhere</title><pre id="log"></pre><script>
var log = document.getElementById("log");
var ws = new WebSocket("ws://HOST/ws/feed/?after=0");
ws.onopen = function () { log.textContent += "open "; };
ws.onmessage = function (m) { log.textContent += "message "; };
ws.onclose = function (e) { log.textContent += "close:" + e.code + " "; };
</script>"""


@pytest.fixture
def elsewhere(server) -> Iterator[str]:
    """A page on another port of the same host (cookies are not separated by port)."""
    body = ATTACK.replace("HOST", urlparse(server.url).netloc).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    httpd = http.server.HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_page_on_another_port_cannot_open_the_operators_websocket(page: Page, server, elsewhere):
    task = factories.task(factories.agent())
    login(page, server.url, factories.console_user("operator").actor.name)
    wait_live(page)  # the console's own page is let in
    page.goto(elsewhere)
    log = page.locator("#log")
    expect(log).to_contain_text("close:")
    journal_note(task.pk, "not for other origins")
    page.wait_for_timeout(1000)  # a message would have arrived by now; none may
    text = log.text_content() or ""
    assert "open" not in text and "message" not in text, text
    assert "close:1006" in text  # refused at the handshake
