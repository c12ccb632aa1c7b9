"""How the console writes amounts and durations for people (pure helpers shared by pages)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

# Currency symbols for the codes people meet most; any other code is written after the amount.
_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}
DEFAULT_CURRENCY = "USD"  # params without a "currency" (the demo's charges) are in US cents


def money(params: Any) -> str | None:
    """``amount_cents`` as people read money, with its currency and the exact cents:
    "$120.00 (12000 cents)". The currency is params' ``currency`` (an ISO 4217 code), else USD.
    None when params carry no integer amount."""
    if not isinstance(params, dict):
        return None
    cents = params.get("amount_cents")
    if not isinstance(cents, int) or isinstance(cents, bool):
        return None
    code = params.get("currency")
    if not (isinstance(code, str) and len(code) == 3 and code.isascii() and code.isalpha()):
        code = DEFAULT_CURRENCY
    code = code.upper()
    major = f"{Decimal(abs(cents)).scaleb(-2):,.2f}"  # exact: no float rounding of large sums
    sign = "-" if cents < 0 else ""
    symbol = _SYMBOLS.get(code)
    shown = f"{sign}{symbol}{major}" if symbol else f"{sign}{major} {code}"
    return f"{shown} ({cents} cents)"


def waited(since: datetime, now: datetime) -> str:
    """How long something has waited, as people say it: "45s", "12m", "3h 05m", "2d 4h"."""
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def elapsed(seconds: float) -> str:
    """A short span between two events: "0.4s" under ten seconds, then as ``waited`` says it
    (static/console.js formats live events the same way)."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    return waited(datetime.fromtimestamp(0, UTC), datetime.fromtimestamp(seconds, UTC))
