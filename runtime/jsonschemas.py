"""JSON Schema for completion checks: a schema is input from an agent, so it refers only inside
itself.

jsonschema follows a ``$ref`` to any URL (http, file) unless told otherwise, which made the web
process and the workers fetch what an agent named (and echo it in the check's reason): a port
scanner and a file reader for any agent. So a schema may refer only to its own parts ("#..."),
its ``$schema`` may name only a metaschema jsonschema ships, and every validation resolves
through a registry that retrieves nothing, so a schema stored before this rule still fetches
nothing. jsonschema is imported on first use (the web process rarely needs it)."""

from __future__ import annotations

import functools
import json
from typing import Any

from django.conf import settings

from runtime.errors import InvalidInput
from runtime.models import CheckResult as R

_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose value maps names to subschemas: the names are not keywords.
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)
# Keywords whose value is an instance (data), never a schema.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _refuse_retrieval(uri: str) -> Any:
    import referencing.exceptions  # noqa: PLC0415 (on first use: the web process rarely needs it)

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


@functools.cache
def _local_registry() -> Any:
    """Resolves references inside the schema and the shipped metaschemas, and retrieves
    nothing (jsonschema adds its bundled metaschemas to a registry it is given)."""
    import referencing  # noqa: PLC0415 (on first use: the web process rarely needs it)

    return referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


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


def schema_reference_problem(schema: Any) -> str | None:
    """Where ``schema`` reaches outside itself (a reference that is not "#...", a ``$schema``
    that is not a shipped metaschema), or None. Pure."""
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
            if key in _DATA_KEYWORDS:
                continue
            if key in _REF_KEYWORDS:
                if not (isinstance(value, str) and value.startswith("#")):
                    return f"{key} at {at} must refer inside the schema (start with '#')"
            elif key == "$schema":
                if not (isinstance(value, str) and value.rstrip("#") in _shipped_metaschemas()):
                    return (
                        f"$schema at {at} must name a known JSON Schema draft "
                        f"({', '.join(sorted(_shipped_metaschemas()))})"
                    )
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((sub, f"{at}/{name}") for name, sub in value.items())
            else:
                stack.append((value, at))
    return None


def json_schema_validate(schema: Any, field: str) -> None:
    """Refuse (400 naming ``field``) what is not a JSON Schema object valid for its draft, or
    that refers outside itself."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    if not isinstance(schema, dict):
        raise InvalidInput(f"{field} must be a JSON Schema object", field=field)
    problem = schema_reference_problem(schema)
    if problem:
        raise InvalidInput(f"{field}: {problem}", field=field)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise InvalidInput(
            f"{field} is not a valid JSON Schema: {exc.message}"[:2000], field=field
        ) from None


def json_schema_verdict(chunks: Any, schema: Any) -> tuple[str, str]:
    """(result, reason) of validating JSON bytes against a schema. Reads at most
    CHECK_JSON_MAX_BYTES: a larger document is unavailable to this checker, not failed. A
    schema that refers outside itself (stored before that was refused) is unavailable, and
    nothing is retrieved."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)
    import referencing.exceptions  # noqa: PLC0415 (on first use: the web process rarely needs it)

    if not isinstance(schema, dict):
        return R.UNAVAILABLE, "the schema is not a JSON Schema object"
    problem = schema_reference_problem(schema)
    if problem:
        return R.UNAVAILABLE, f"the schema is refused: {problem}"[:2000]
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
    validator_class = jsonschema.validators.validator_for(schema)
    validator = validator_class(schema, registry=_local_registry())
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    except referencing.exceptions.Unresolvable:
        # Not the exception's text: it could carry whatever a resolver met.
        return R.UNAVAILABLE, "the schema has a reference that does not resolve inside it"
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return R.FAILED, f"{where}: {error.message}"[:2000]
    return R.PASSED, ""


@functools.cache
def _strict_validator_class(draft: type) -> Any:
    """The draft's validator with "integer" meaning a JSON integer only: 5.0 is refused, as the
    receivers keep integers and the parameters are hashed and stored exactly as sent."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    checker = draft.TYPE_CHECKER.redefine(  # type: ignore[attr-defined]
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(draft, type_checker=checker)


def json_schema_compile(schema: dict[str, Any]) -> Any:
    """A validator for a schema of ours (a tool's ``params_schema``): the schema is checked as
    ``json_schema_validate`` checks an agent's (no reference outside itself, valid for its
    draft), and references resolve through the registry that retrieves nothing."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    json_schema_validate(schema, "params_schema")
    draft = jsonschema.validators.validator_for(schema)
    return _strict_validator_class(draft)(schema, registry=_local_registry())


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
