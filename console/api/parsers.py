"""Request body parsing: JSON that PostgreSQL can store and canonical JSON can hash, or a 400.

Python's ``json`` accepts documents that fail later, deep inside a write: ``\\u0000`` in a
string (jsonb and text columns refuse it), lone surrogates (not encodable as UTF-8), numbers
beyond a double's range (parsed as ``inf``, not valid JSON for jsonb) and nesting deep enough
to exhaust the interpreter's recursion limit. Refusing them here keeps every handler's input
storable, so such bodies are malformed requests rather than server errors."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils.json import strict_constant

# Far beyond any real tool's parameters, far below the interpreter's recursion limit (the
# hashing and the jsonb encoder recurse once per level).
MAX_DEPTH = 64


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored as PostgreSQL text, or None."""
    if "\x00" in value:
        return "NUL characters (\\u0000) are not allowed"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "unpaired surrogate characters are not allowed"
    return None


def json_problem(document: Any) -> str | None:
    """Why a parsed JSON document cannot be stored and hashed, or None. Iterative, so the check
    itself cannot hit the recursion limit."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value)
            if problem:
                return problem
        elif isinstance(value, float):
            if not math.isfinite(value):
                return "numbers must be finite (within a double's range)"
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return f"JSON is nested more than {MAX_DEPTH} levels deep"
            if isinstance(value, dict):
                for key, item in value.items():
                    stack.append((key, depth))
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
    return None


class DuplicateKey(ValueError):
    pass


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python keeps the last of duplicate keys while other parsers keep the first: the same body
    # would mean different things to the client and to us, so it is refused.
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise DuplicateKey(f"duplicate key {key!r}")
        document[key] = value
    return document


class JSONParser(parsers.JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        context = parser_context or {}
        encoding = context.get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
            document = json.loads(
                text, object_pairs_hook=_unique_object, parse_constant=strict_constant
            )
        except RecursionError:
            raise ParseError(f"JSON is nested more than {MAX_DEPTH} levels deep") from None
        except DuplicateKey as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            # json.JSONDecodeError is a ValueError; invalid UTF-8 is a UnicodeDecodeError.
            raise ParseError(f"JSON parse error - {exc}") from None
        problem = json_problem(document)
        if problem:
            raise ParseError(f"JSON parse error - {problem}")
        return document


# JSON endpoints take JSON only: a form-encoded body would lose every nested field (params,
# input) and be read as something else than what was sent, so it is a 415 instead.
PARSER_CLASSES = [JSONParser]
