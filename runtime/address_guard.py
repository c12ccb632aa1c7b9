"""The address guard of outbound HTTP an admin points the console at (notification webhooks,
declared HTTP tools): a request reaches only globally routable addresses (``address_refused``:
every address the host resolves to is checked, IPv4 addresses carried inside IPv6 ones
included, and the connection goes to a checked address: runtime.tools.outbound) unless the
deployment's switch for that use allows private hosts (NOTIFY_ALLOW_PRIVATE_HOSTS for webhooks,
TOOL_ALLOW_PRIVATE_HOSTS for HTTP tools). A URL naming a refused IP literal is refused when it
is saved; a name is checked at each request (DNS answers change).

One guard for every use (moved here from runtime.notify_secrets, which still offers it to its
callers), so a fix to it protects them all."""

from __future__ import annotations

import ipaddress
import socket
import unicodedata
from urllib.parse import urlsplit

from django.conf import settings

from runtime.errors import InvalidInput

# The switch of the notification webhooks: the default of every function here.
NOTIFY_SWITCH = "NOTIFY_ALLOW_PRIVATE_HOSTS"


def private_allowed(switch: str = NOTIFY_SWITCH) -> bool:
    """Whether the deployment lets this use reach private addresses (the setting ``switch``)."""
    return bool(getattr(settings, switch, False))


_URL_FORM = "url must be an http:// or https:// URL with a host (at most 2000 characters)"


def url_validate(url: str, *, switch: str = NOTIFY_SWITCH) -> str:
    """The URL an admin typed, without its surrounding spaces, when the notifier can post to it;
    InvalidInput naming ``url`` (before anything is stored) when:

    - it holds a control, format or whitespace character anywhere (a CR/LF would end the
      request line it is sent in; urlsplit silently drops some of them, so this reads the raw
      text first);
    - it is not http(s) with a host, its port is not a number in 1-65535, or a bracketed host is
      not an IPv6 address (urlsplit and ``.port`` raise ValueError for some of these);
    - its host is an IP literal the address guard refuses (``address_refused``), unless
      the setting ``switch`` (NOTIFY_ALLOW_PRIVATE_HOSTS by default) allows private hosts. A
      name is not resolved here: it is checked at each request."""
    url = (url or "").strip(" ")
    if not url or len(url) > 2000:
        raise InvalidInput(_URL_FORM, field="url")
    for char in url:
        # C*: control, format (bidi overrides, zero-width), surrogates; Z*: every space.
        if unicodedata.category(char)[0] in "CZ":
            raise InvalidInput(
                f"url must not contain spaces or control characters (found {char!r})", field="url"
            )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a broken [IPv6] literal
        raise InvalidInput(f"url is not a valid URL: {exc}", field="url") from None
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput(_URL_FORM, field="url")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise InvalidInput("url's port must be a number from 1 to 65535", field="url")
    if not (parts.path + parts.query + parts.fragment).isascii():
        # http.client sends the request line as ASCII: refused now rather than failing later.
        raise InvalidInput(
            "url's path and query must be ASCII (percent-encode the rest)", field="url"
        )
    hostport = parts.netloc.rpartition("@")[2]
    bracketed = hostport.startswith("[")
    if bracketed and hostport.partition("]")[2][:1] not in ("", ":"):  # the port is read above
        raise InvalidInput(f"url is not a valid URL: {hostport!r} is not [host]:port", field="url")
    literals = _literal_addresses(host, bracketed=bracketed)
    if not private_allowed(switch):
        refused = [a for a in literals if address_refused(a)]
        if refused:
            raise InvalidInput(
                f"url's host {refused[0]} is not a globally routable address; set "
                f"{switch}=1 to allow it",
                field="url",
            )
    return url


def _literal_addresses(host: str, *, bracketed: bool) -> list[str]:
    """The addresses ``host`` stands for when it is an IP literal, parsed as the connection will
    parse it (AI_NUMERICHOST: no DNS; it also reads inet_aton's forms, 2852039166 or
    0xa9.0xfe.0xa9.0xfe for 169.254.169.254); [] for a name."""
    if bracketed:
        try:
            return [str(ipaddress.IPv6Address(host.split("%", 1)[0]))]
        except ValueError:
            raise InvalidInput("url's [host] must be an IPv6 address", field="url") from None
    try:
        host.encode("idna")
    except UnicodeError:
        raise InvalidInput("url's host is not a valid host name", field="url") from None
    try:
        infos = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return []  # a name
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def url_hint(url: str) -> str:
    """Scheme, host and port only (the path and query may be a receiver's secret). A URL from
    the environment is not validated on the way in: a malformed one is shown as such."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not a valid URL)"
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{parts.scheme}://{host}{port}/…"


class PrivateHost(Exception):
    """The host resolves to an address the guard refuses."""


# Blocks the IANA special-purpose registries mark not globally reachable that Python 3.11's
# is_global calls global (its tables were corrected in 3.12.4 and 3.13), refused explicitly.
_NOT_GLOBAL = tuple(
    ipaddress.ip_network(block)
    for block in (
        "100.64.0.0/10",  # shared address space (RFC 6598): a cloud's metadata service is there
        "192.0.0.0/24",  # IETF protocol assignments (3.11 lists only 192.0.0.0/29)
        "192.88.99.0/24",  # 6to4 relay anycast, deprecated (RFC 7526)
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215)
        "3fff::/20",  # documentation (RFC 9637)
        "5f00::/16",  # SRv6 SIDs (RFC 9602)
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix (RFC 6052)
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # IPv4-compatible, deprecated (RFC 4291)
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address a packet to ``ip`` may end up at: IPv4-mapped, 6to4, Teredo (its
    server and its client, de-obfuscated), NAT64 and IPv4-compatible (the low 32 bits; the
    ``ipaddress`` module leaves these two to the caller)."""
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64 or ip in _V4_COMPATIBLE:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _globally_routable(ip: _Address) -> bool:
    return (
        ip.is_global
        and not (
            ip.is_multicast
            or ip.is_reserved
            or ip.is_unspecified
            or ip.is_loopback
            or ip.is_link_local
            or ip.is_private
        )
        and not any(ip in block for block in _NOT_GLOBAL if block.version == ip.version)
    )


def address_refused(address: str) -> bool:
    """True when a webhook may not reach ``address`` (an IP literal, with or without a
    ``%scope``): it is not globally routable (``is_global``, and neither multicast, reserved nor
    unspecified), or an IPv4 address it carries is not. The NAT64 well-known prefix is judged by
    the address it carries alone: Python calls all of 64:ff9b::/96 reserved (it lies in ::/8),
    yet it is how an IPv6-only host reaches public IPv4 receivers.

    Own code over a library: the SSRF-guard packages wrap a whole HTTP client (advocate, for
    ``requests``) and are no longer kept; this is a table over the standard ``ipaddress``."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        return not _globally_routable(ip)
    judged: list[_Address] = list(_embedded_ipv4(ip))
    if ip not in _NAT64:
        judged.append(ip)
    return not all(_globally_routable(a) for a in judged)


def host_addresses(host: str, port: int, *, switch: str = NOTIFY_SWITCH) -> list[str]:
    """Every address ``host`` resolves to, each checked: PrivateHost when any of them is
    refused by ``address_refused`` (a name that resolves to both kinds is refused too), unless
    the setting ``switch`` allows private hosts. OSError when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not private_allowed(switch):
        refused = [a for a in addresses if address_refused(a)]
        if refused:
            raise PrivateHost(
                f"{host} resolves to an address that is not globally routable ({refused[0]}); "
                f"set {switch}=1 to allow it"
            )
    return addresses
