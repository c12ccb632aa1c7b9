"""What a person reads is what will run: the one rule for characters that are invisible or that
change how the text around them reads (bidi overrides and isolates, zero-width characters, line
and paragraph separators, the byte order mark, other Unicode format and control characters).

Names (tasks, steps, required checks, artifacts) refuse them; free text and tool parameters keep
them, and the console shows each one escaped (console/templatetags/visible.py). Pure."""

from __future__ import annotations

import unicodedata

from runtime.errors import InvalidInput

# Cc: controls; Cf: format (U+200B-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF, U+061C, ...);
# Zl/Zp: U+2028/U+2029.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def char_hidden(ch: str) -> bool:
    """Whether a person cannot see this character where it stands, or it reorders the text."""
    return unicodedata.category(ch) in HIDDEN_CATEGORIES


def text_has_hidden(text: str) -> bool:
    # str.isprintable() is False for every hidden category: the common case costs one C call.
    return not text.isprintable() and any(char_hidden(ch) for ch in text)


def char_label(ch: str) -> str:
    """``U+202E`` for a character."""
    return f"U+{ord(ch):04X}"


def name_check(value: str, field: str) -> str:
    """Refuse a name that holds a hidden character, naming the field and the character (400
    ``invalid_input``). Returns the value unchanged."""
    for ch in value:
        if char_hidden(ch):
            raise InvalidInput(
                f"{field} must not contain control or formatting characters "
                f"(found {char_label(ch)})",
                field=field,
            )
    return value
