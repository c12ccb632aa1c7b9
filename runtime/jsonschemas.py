"""JSON Schema for completion checks: a schema is input from an agent, so it refers only inside
itself, its patterns run in linear time, and its references end.

jsonschema follows a ``$ref`` to any URL (http, file) unless told otherwise, which made the web
process and the workers fetch what an agent named (and echo it in the check's reason): a port
scanner and a file reader for any agent. So a schema may refer only to its own parts ("#..."),
its ``$schema`` may name only a metaschema jsonschema ships, and every validation resolves
through a registry that retrieves nothing, so a schema stored before this rule still fetches
nothing.

Every schema runs on the validators of ``runtime.jsonschema_engine``: patterns on RE2, never on
Python's backtracking ``re`` (``^(a+)+$`` stalled the whole web process); a pattern RE2 cannot
run is refused at definition (that module's docstring says what RE2 accepts). A reference that
comes back to itself without descending into the document (``{"$ref": "#"}``) is refused at
definition too: validation would only end in a RecursionError. A schema stored before these
rules is ``unavailable`` when checked. jsonschema is imported on first use (the web process
rarely needs it)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from runtime import jsonschema_engine as engine
from runtime.errors import InvalidInput
from runtime.jsonschema_cycles import reference_cycle
from runtime.models import CheckResult as R

_PATTERN_LIMITS = "backreferences, lookaround, \\Z, counts over 1000"


@functools.cache
def _shipped_metaschemas() -> frozenset[str]:
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    classes = (
        jsonschema.Draft3Validator,
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
    return frozenset(str(c.ID_OF(c.META_SCHEMA)).rstrip("#") for c in classes)


def _keywords(schema: Any) -> Iterator[tuple[str, Any, str]]:
    """Every (keyword, value, place) of ``schema`` where a keyword may stand: everywhere but
    inside data (``enum``, ``const``...) and the names of a map of subschemas. Anything else
    is walked: a ``$ref`` can point at any part of the document."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{where}/{i}") for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            at = f"{where}/{key}"
            if key in engine.DATA_KEYWORDS:
                continue
            yield key, value, at
            if key in engine.SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((sub, f"{at}/{name}") for name, sub in value.items())
            elif key not in engine.REF_KEYWORDS and key != "$schema":
                stack.append((value, at))


def schema_reference_problem(schema: Any) -> str | None:
    """Where ``schema`` reaches outside itself (a reference that is not "#...", a ``$schema``
    that is not a shipped metaschema), or None. Pure."""
    for key, value, at in _keywords(schema):
        if key in engine.REF_KEYWORDS:
            if not (isinstance(value, str) and value.startswith("#")):
                return f"{key} at {at} must refer inside the schema (start with '#')"
        elif key == "$schema" and not (
            isinstance(value, str) and value.rstrip("#") in _shipped_metaschemas()
        ):
            return (
                f"$schema at {at} must name a known JSON Schema draft "
                f"({', '.join(sorted(_shipped_metaschemas()))})"
            )
    return None


def schema_pattern_problem(schema: Any) -> str | None:
    """Where ``schema`` has a pattern (``pattern``, a ``patternProperties`` name) that the
    linear-time engine cannot run, in its words, or None. A pattern that is not a string is
    left to the metaschema."""
    for key, value, at in _keywords(schema):
        if key == "pattern" and isinstance(value, str):
            named = f"pattern at {at}"
            problem = engine.pattern_problem(value)
        elif key == "patternProperties" and isinstance(value, dict):
            named, problem = "", None
            for name in value:
                problem = engine.pattern_problem(name)
                if problem:
                    named = f"patternProperties name {name!r} at {at}"
                    break
        else:
            continue
        if problem:
            return (
                f"{named} uses a construct the linear-time engine cannot run "
                f"({_PATTERN_LIMITS}): {problem}"
            )
    return None


def json_schema_validate(schema: Any, field: str) -> None:
    """Refuse (400 naming ``field``) what is not a JSON Schema object valid for its draft, that
    refers outside itself, has a pattern RE2 cannot run, or a reference that never ends."""
    if not isinstance(schema, dict):
        raise InvalidInput(f"{field} must be a JSON Schema object", field=field)
    problem = schema_reference_problem(schema) or schema_pattern_problem(schema)
    if problem:
        raise InvalidInput(f"{field}: {problem}"[:2000], field=field)
    invalid = engine.metaschema_problem(schema)
    if invalid is not None:
        raise InvalidInput(f"{field} is not a valid JSON Schema: {invalid}"[:2000], field=field)
    place = reference_cycle(schema)
    if place is not None:
        raise InvalidInput(
            f"{field}: the reference at {place} comes back to itself without descending into "
            "the document, so validating would never end (a schema may refer to itself only "
            "under properties, items and the like)"[:2000],
            field=field,
        )


def json_schema_verdict(chunks: Any, schema: Any) -> tuple[str, str]:
    """(result, reason) of validating JSON bytes against a schema. Reads at most
    CHECK_JSON_MAX_BYTES: a larger document is unavailable to this checker, not failed. A
    schema stored before a rule it breaks (a reference outside itself, a pattern RE2 cannot
    run, a reference without end) is unavailable, and nothing is retrieved or run on ``re``."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)
    import referencing.exceptions  # noqa: PLC0415 (on first use: the web process rarely needs it)

    if not isinstance(schema, dict):
        return R.UNAVAILABLE, "the schema is not a JSON Schema object"
    problem = schema_reference_problem(schema) or schema_pattern_problem(schema)
    if problem:
        return R.UNAVAILABLE, f"the schema is refused: {problem}"[:2000]
    place = reference_cycle(schema)
    if place is not None:
        return R.UNAVAILABLE, f"the schema refers to itself without end (at {place})"[:2000]
    limit = settings.CHECK_JSON_MAX_BYTES
    buffer = bytearray()
    for chunk in chunks:
        buffer.extend(chunk)
        if len(buffer) > limit:
            return R.UNAVAILABLE, f"the document is larger than {limit} bytes"
    try:
        document = json.loads(bytes(buffer).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return R.FAILED, f"not JSON: {exc}"
    except RecursionError:
        return R.UNAVAILABLE, "the document nests too deeply to check"
    validator = engine.validator_class(schema)(schema, registry=engine.local_registry())
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    except referencing.exceptions.Unresolvable:
        # Not the exception's text: it could carry whatever a resolver met.
        return R.UNAVAILABLE, "the schema has a reference that does not resolve inside it"
    except engine.PatternRefused as exc:
        return R.UNAVAILABLE, f"the schema is refused: {exc}"[:2000]
    except RecursionError:
        # Defence in depth: a cycle the static check missed, or a document nested deeper
        # than the interpreter's stack under a recursive schema.
        return (
            R.UNAVAILABLE,
            "the schema refers to itself without end, or the document nests too deeply to check",
        )
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return R.FAILED, f"{where}: {error.message}"[:2000]
    return R.PASSED, ""


def json_schema_compile(schema: dict[str, Any]) -> Any:
    """A validator for a schema of ours (a tool's ``params_schema``): the schema is checked as
    ``json_schema_validate`` checks an agent's, runs on the same validators (patterns on RE2),
    "integer" meaning a JSON integer only (5.0 is refused: the parameters are hashed and stored
    exactly as sent), and references resolve through the registry that retrieves nothing."""
    json_schema_validate(schema, "params_schema")
    cls = engine.validator_class(schema, strict_integers=True)
    return cls(schema, registry=engine.local_registry())


def _error_field(error: Any, field: str) -> str:
    """``field`` plus the error's path as dotted names (``params.amount_cents``); a missing
    required property is named itself, not its parent."""
    parts = [field, *(str(p) for p in error.absolute_path)]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [n for n in error.validator_value if n not in error.instance]
        if missing:
            parts.append(str(missing[0]))
    out = parts[0]
    for part in parts[1:]:
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


def json_instance_check(instance: Any, validator: Any, field: str, *, subject: str = "") -> None:
    """Refuse (400 ``invalid_input``, naming the offending field under ``field``) an instance
    the compiled ``validator`` rejects. ``subject`` (a tool's name) closes the message."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is None:
        return
    where = _error_field(error, field)
    # The field first: callers that nest a refusal (runtime.checkers) prefix it to the message.
    said = "is required" if error.validator == "required" else f"is refused: {error.message}"
    of = f" ({subject}; its schema: GET /api/v1/tools)" if subject else ""
    raise InvalidInput(f"{where} {said[:1800]}{of}", field=where)
