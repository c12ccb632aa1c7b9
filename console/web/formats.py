"""How the console writes amounts and durations for people, and reads the filters they type
(pure helpers shared by pages)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from runtime.errors import InvalidInput

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
    code = currency_of(params)
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


def currency_of(params: Any) -> str:
    """The ISO 4217 code ``money`` writes ``params``' amount in."""
    code = params.get("currency") if isinstance(params, dict) else None
    if isinstance(code, str) and len(code) == 3 and code.isascii() and code.isalpha():
        return code.upper()
    return DEFAULT_CURRENCY


_SHOWN_PARAMS = 4
_SHOWN_CHARS = 40


def what_runs(tool: str, params: Any) -> str:
    """A tool and its key parameters as a person checks them before releasing the call:
    "demo.payments.charge with account acct-42, amount 12000 cents". Scalars first, by name,
    at most four, each cut at 40 characters; the amount is named by ``money`` elsewhere."""
    if not isinstance(params, dict) or not params:
        return tool
    shown = []
    for key in sorted(params, key=lambda k: (isinstance(params[k], dict | list), k)):
        if key in ("amount_cents", "currency"):
            continue
        value = params[key]
        text = (
            "{…}" if isinstance(value, dict) else "[…]" if isinstance(value, list) else str(value)
        )
        if len(text) > _SHOWN_CHARS:
            text = text[: _SHOWN_CHARS - 1] + "…"
        shown.append(f"{key} {text}")
    more = len(shown) - _SHOWN_PARAMS
    words = ", ".join(shown[:_SHOWN_PARAMS]) + (f" and {more} more" if more > 0 else "")
    return f"{tool} with {words}" if words else tool


def day_start(text: str, field: str, *, after: bool = False) -> datetime:
    """A date filter's day ("2026-12-05") as its UTC midnight; ``after``: the next midnight, so
    an "until" day is included whole. InvalidInput (400) for anything else."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{field} is a date, such as 2026-12-05", field=field) from None
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start + timedelta(days=1) if after else start


def param_filter(text: str) -> tuple[str, str]:
    """A parameter filter as people type it, ``name=value``, split at the first "=". The name
    is checked by the selector (runtime.selectors.tasks.task_param_match)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise InvalidInput(
            "a parameter filter is name=value, such as account=acct-1042", field="param"
        )
    return name.strip(), value.strip()
