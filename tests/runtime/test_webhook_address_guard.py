"""The webhook address guard (runtime.notify_secrets): a webhook reaches only globally
routable addresses, judged after unwrapping every IPv4 address an IPv6 one carries (mapped,
compatible, 6to4, Teredo, NAT64), unless NOTIFY_ALLOW_PRIVATE_HOSTS. Refused at delivery for a
name whose DNS answer is such an address (no connection is opened), and already when an admin
saves a URL whose host is such an IP literal (nothing stored). Malformed URLs (bad port, broken
IPv6 literal, control characters or spaces) are refused on the way in with InvalidInput naming
``url``. getaddrinfo on a literal does no DNS; names are answered by a stub: no traffic leaves."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest
from django.test.utils import override_settings

from runtime.errors import InvalidInput
from runtime.models import AuditRecord, NotificationEndpoint, Operation
from runtime.notifications.endpoints import endpoint_create
from runtime.notify_secrets import PrivateHost, address_refused, host_addresses, url_validate
from runtime.tool_invocation import invocation_context
from runtime.tools import ToolFailure, adapter_for
from tests import factories


def _teredo(server: str, client: str, port: int = 40000) -> str:
    """A Teredo address (RFC 4380): 2001:0::/32, the server's IPv4, flags, then the client's
    port and IPv4 each with every bit flipped ("obfuscated")."""
    value = (
        (0x2001_0000 << 96)
        | (int(ipaddress.IPv4Address(server)) << 64)
        | (0x8000 << 48)
        | ((port ^ 0xFFFF) << 32)
        | (int(ipaddress.IPv4Address(client)) ^ 0xFFFF_FFFF)
    )
    address = ipaddress.IPv6Address(value)
    assert address.teredo == (ipaddress.IPv4Address(server), ipaddress.IPv4Address(client))
    return str(address)


TEREDO_METADATA = _teredo("65.54.227.120", "169.254.169.254")

REFUSED = [
    "100.64.0.1",  # shared address space (RFC 6598)
    "100.127.255.254",
    "100.100.100.200",  # a cloud's metadata service, inside 100.64.0.0/10
    "169.254.169.254",
    "10.1.2.3",
    "127.0.0.1",
    "0.0.0.0",
    "192.0.0.1",
    "192.0.0.8",  # IETF protocol assignments: Python 3.11 lists only 192.0.0.0/29
    "198.18.0.1",
    "240.0.0.1",
    "255.255.255.255",
    "224.0.0.1",  # multicast: Python 3.11 calls it global
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "2002:0a00:0001::",  # 6to4 of 10.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 well-known prefix
    "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
    "64:ff9b:1::808:808",  # local-use NAT64 is never global, whatever it carries
    TEREDO_METADATA,
    "::169.254.169.254",  # IPv4-compatible
    "::ffff:169.254.169.254",  # IPv4-mapped
    "::ffff:8.8.8.8",
    "::",
    "::1",
    "ff02::1",
    "ff0e::1",  # global-scope multicast: Python 3.11 calls it global
    "fe80::1%eth0",
    "fc00::1",
    "2001:db8::1",
    "3fff::1",  # documentation (RFC 9637)
]
ACCEPTED = ["8.8.8.8", "2606:4700::1111", "2002:0808:0808::", "64:ff9b::808:808"]


@pytest.mark.parametrize("address", REFUSED)
def test_every_non_global_address_is_refused(address):
    assert address_refused(address)


@pytest.mark.parametrize("address", ACCEPTED)
def test_a_globally_routable_address_is_accepted(address):
    assert not address_refused(address)


@pytest.mark.parametrize("address", [a for a in REFUSED if "%" not in a])
def test_a_refused_literal_is_refused_by_the_resolver_check_unless_allowed(address):
    # getaddrinfo on a literal parses it: no DNS query is sent.
    with pytest.raises(PrivateHost, match="not globally routable"):
        host_addresses(address, 443)
    with override_settings(NOTIFY_ALLOW_PRIVATE_HOSTS=True):
        assert host_addresses(address, 443)


@pytest.mark.parametrize("address", ACCEPTED)
def test_a_global_literal_passes_the_resolver_check(address):
    assert host_addresses(address, 443) == [str(ipaddress.ip_address(address))]


# --- delivery: no connection is ever opened to a refused address -------------------------------


class _Wire:
    """DNS answers for names (a stub) and every connection attempted (none is made)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[str, str]) -> None:
        self.connections: list[Any] = []
        real = socket.getaddrinfo

        def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
            # A numeric-only parse (AI_NUMERICHOST) never resolves a name, the stub's included.
            if host in answers and not kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
                return real(answers[host], port, *args, **kwargs)
            return real(host, port, *args, **kwargs)

        def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
            self.connections.append(address)
            raise ConnectionRefusedError("no traffic leaves a test")

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket, "create_connection", create_connection)


def _deliver(url: str) -> ToolFailure:
    op = Operation(
        pk="op_guard",
        task_id="tsk_guard",
        tool="notify.webhook",
        step="notify.approval_requested",
        idempotency_key="sys_runtime/notice:nev_1:endpoint%3Aenv-webhook:webhook",
        params={"endpoint": "env-webhook", "payload": {"kind": "approval_requested"}},
    )
    ctx = invocation_context(op, fencing_token=1, invocation_number=1)
    with (
        override_settings(NOTIFY_WEBHOOK_URL=url, NOTIFY_WEBHOOK_SECRET="s3cret"),
        pytest.raises(ToolFailure) as failed,
    ):
        adapter_for("notify.webhook").invoke(ctx)
    return failed.value


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@pytest.mark.django_db
@pytest.mark.parametrize("address", [a for a in REFUSED if "%" not in a])
def test_a_name_resolving_to_a_refused_address_gets_no_connection(monkeypatch, address):
    wire = _Wire(monkeypatch, {"hooks.example.test": address})
    failure = _deliver("https://hooks.example.test/hook")
    assert failure.kind == ToolFailure.PERMANENT, failure
    assert "not globally routable" in str(failure)
    assert wire.connections == []


@pytest.mark.django_db
@pytest.mark.parametrize("address", REFUSED)
def test_a_refused_literal_in_the_environments_url_gets_no_connection(monkeypatch, address):
    wire = _Wire(monkeypatch, {})
    failure = _deliver(f"http://{_bracketed(address.replace('%', '%25'))}/hook")
    assert failure.kind == ToolFailure.PERMANENT, failure
    assert wire.connections == []


@pytest.mark.django_db
@pytest.mark.parametrize("address", ACCEPTED)
def test_a_name_resolving_to_a_global_address_is_connected_to_that_address(monkeypatch, address):
    wire = _Wire(monkeypatch, {"hooks.example.test": address})
    failure = _deliver("https://hooks.example.test/hook")
    # The guard let it through: the one connection attempted is to the checked address.
    assert failure.kind == ToolFailure.TRANSIENT, failure
    assert wire.connections == [(str(ipaddress.ip_address(address)), 443)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url", ["http://h:99999/", "http://h:abc/", "http://[::1/", "http://x/\r\n"]
)
def test_a_malformed_url_from_the_environment_fails_permanently_without_a_connection(
    monkeypatch, url
):
    wire = _Wire(monkeypatch, {})
    failure = _deliver(url)
    assert failure.kind == ToolFailure.PERMANENT, failure
    assert wire.connections == []


# --- definition: what an admin saves -----------------------------------------------------------

BAD_URLS = [
    "https://hooks.example.test:99999/h",
    "https://hooks.example.test:abc/h",
    "https://hooks.example.test:0/h",
    "https://hooks.example.test:-1/h",
    "http://[::1/",
    "http://[::1]x/",
    "http://[v1.future]/",
    "https://hooks.example.test/h\r\nX-Injected: 1",
    "https://hooks.example.test/h\n",
    "https://hooks.example.test/h\r",
    "https://hooks.example.test/a b",
    "https://hooks.example.test/a\tb",
    "https://hooks.example.test/a\x01b",
    "https://hooks.example.test/a\x7fb",
    "https://hooks.example.test/a\u200bb",  # zero-width space
    "https://hooks.example.test/a\u00a0b",  # no-break space
    "https://hooks.ex\u202eample.test/",  # right-to-left override
    "https://hooks..example.test/",
    "https://hooks.example.test/caf\u00e9",  # not ASCII: http.client could not send it
    "ftp://hooks.example.test/",
    "https:///no-host",
    "",
    "https://hooks.example.test/" + "a" * 2000,
]
REFUSED_LITERAL_URLS = [
    *(f"http://{_bracketed(a.replace('%', '%25'))}/hook" for a in REFUSED),
    "http://2852039166/",  # 169.254.169.254 as inet_aton reads it
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://169.254.43518/",
    "http://[fe80::1%eth0]:8080/",
]


def _nothing_stored() -> None:
    assert not NotificationEndpoint.objects.exists()
    assert not AuditRecord.objects.filter(action="endpoint.added").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", BAD_URLS + REFUSED_LITERAL_URLS)
def test_a_bad_or_refused_url_is_not_saved(url):
    admin = factories.console_user("admin")
    with pytest.raises(InvalidInput) as refused:
        endpoint_create(admin.actor, name="hook", url=url, fmt="webhook", kinds=[])
    assert refused.value.details == {"field": "url"}
    assert refused.value.message.startswith("url")
    _nothing_stored()


@pytest.mark.parametrize("url", REFUSED_LITERAL_URLS)
def test_a_non_global_literal_is_refused_unless_the_opt_out_allows_it(url):
    with pytest.raises(InvalidInput, match="not a globally routable address"):
        url_validate(url)
    with override_settings(NOTIFY_ALLOW_PRIVATE_HOSTS=True):
        assert url_validate(url) == url


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "saved"),
    [
        *((f"https://{_bracketed(a)}:8443/hook?t=1", True) for a in ACCEPTED),
        ("https://metadata.internal.test/hook", True),  # a name: checked at each delivery
        ("https://b\u00fccher.example/hook", True),  # an internationalised name
        ("  https://hooks.example.test/h  ", True),
        ("https://hooks.example.test:8443/h", True),
        ("https://hooks.example.test:84430/h", False),
        ("http://[2606:4700::1111/h", False),
        ("https://hooks.example.test/h\r\n", False),
        ("http://[64:ff9b::a9fe:a9fe]/h", False),
    ],
)
def test_an_admin_saves_a_good_url_and_nothing_of_a_bad_one(url, saved):
    admin = factories.console_user("admin")
    try:
        endpoint_create(admin.actor, name="hook", url=url, fmt="webhook", kinds=[])
    except InvalidInput as refused:
        assert refused.details == {"field": "url"}
    assert NotificationEndpoint.objects.filter(active=True).exists() is saved
