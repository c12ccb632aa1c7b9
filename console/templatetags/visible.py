"""``{{ value|visible }}``: text as a person must read it to decide on it. Every character that
runtime.text hides (bidi overrides and isolates, zero-width characters, separators, other format
and control characters) is shown as a marked ``<U+202E>`` instead of acting on the text around
it; the rest is HTML-escaped as usual. Line breaks stay (pretty-printed JSON keeps its lines).

``{{ value|visible:"text" }}`` gives the same marks as plain text, for places that take no markup
(a page title, an attribute)."""

from __future__ import annotations

import unicodedata
from typing import Any

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from runtime.text import char_hidden, char_label, text_has_hidden

register = template.Library()

_KEPT = "\n"


def _mark(ch: str) -> str:
    label = char_label(ch)
    name = unicodedata.name(ch, "")
    title = f"{label} {name}".strip()
    return f'<span class="hidden-char" title="{escape(title)}">&lt;{label}&gt;</span>'


def _pieces(text: str) -> list[tuple[bool, str]]:
    """The text as runs: (False, plain run) and (True, one hidden character)."""
    pieces: list[tuple[bool, str]] = []
    start = 0
    for i, ch in enumerate(text):
        if ch != _KEPT and char_hidden(ch):
            if start < i:
                pieces.append((False, text[start:i]))
            pieces.append((True, ch))
            start = i + 1
    if start < len(text):
        pieces.append((False, text[start:]))
    return pieces


@register.filter(name="visible")
def visible(value: Any, mode: str = "") -> SafeString | str:
    text = "" if value is None else str(value)
    if not any(text_has_hidden(line) for line in text.split(_KEPT)):
        return text if mode == "text" else escape(text)
    if mode == "text":  # escaped by the template, like any text
        return "".join(f"<{char_label(p)}>" if hidden else p for hidden, p in _pieces(text))
    return mark_safe(  # noqa: S308 - every piece is escaped or built from a code point
        "".join(_mark(p) if hidden else escape(p) for hidden, p in _pieces(text))
    )
