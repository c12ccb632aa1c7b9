"""The validators every JSON Schema from outside runs on: its patterns on RE2, never on ``re``.

A schema's ``pattern`` and ``patternProperties`` are input from an agent, and jsonschema runs
them with Python's ``re``, which backtracks: ``^(a+)+$`` against a's and a "!" holds the GIL for
a time that doubles with each a, so the web process (and a check's time limit, a thread) stops
with it: 26 a's stall it, 40 for good. RE2 matches in time linear in the text, whatever the
pattern. Here jsonschema's own validators are extended (``jsonschema.validators.extend``, for
every draft it ships) with the keywords that run a pattern rewritten on RE2: ``pattern``,
``patternProperties``, ``additionalProperties`` (which asks patternProperties what is
additional) and ``unevaluatedProperties`` (2019-09, 2020-12: it asks them what was evaluated);
the format "regex", which checking a schema against its metaschema runs on every pattern,
compiles with RE2 as well. A validator moving into a
subschema that names another draft (``$schema``) stays on these validators: jsonschema's own
``evolve`` would pick its stock class there, ``re`` included.

What a pattern may say is RE2's syntax (https://github.com/google/re2/wiki/Syntax), close to
ECMA 262's that JSON Schema names, matched on the text as UTF-8:

- accepted: literals, ``.``, classes ``[...]`` with ``\\d \\w \\s \\b`` (ASCII, as in ECMA),
  ``\\p{L}``-style Unicode classes, ``[[:alpha:]]``, anchors ``^ $`` (``$`` is the end of the
  text only, as in ECMA without the m flag, not before a final newline as in Python), groups,
  named groups ``(?P<n>...)`` and ``(?<n>...)``, non-capturing ``(?:...)``, flags ``(?i)``
  ``(?s)`` ``(?m)``, lazy quantifiers, ``{n,m}`` with counts up to 1000, ``\\x41`` and
  ``\\x{263a}``;
- refused: backreferences (``\\1``), lookahead and lookbehind (``(?=`` ``(?!`` ``(?<=``
  ``(?<!``), possessive quantifiers and atomic groups, ``\\Z`` (write ``\\z``), ``\\uXXXX``
  escapes (write ``\\x{XXXX}``, or the character itself: JSON already decodes ``"\\u0041"``),
  ``\\cX``, counts over 1000, and a pattern whose compiled form exceeds RE2's memory budget.

A schema with such a pattern is refused when it is defined; one stored before the rule is
``unavailable`` when checked (``PatternRefused``), never run on ``re``."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import re2

# The vocabulary of the walks over a schema (runtime.jsonschemas, runtime.jsonschema_cycles).
REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose value maps names to subschemas: the names are not keywords.
SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)
# Keywords whose value is an instance (data), never a schema.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})

_OPTIONS = re2.Options()
# An agent's malformed pattern is its own 400, not lines in the server's log.
_OPTIONS.log_errors = False


class PatternRefused(Exception):
    """A stored schema's pattern that RE2 cannot run (stored before patterns were checked)."""


# --- patterns -------------------------------------------------------------------------------


def pattern_problem(pattern: Any) -> str | None:
    """RE2's words for why it cannot run ``pattern``, or None. Compiled forms are cached by
    the re2 module (its LRU of 128)."""
    if not isinstance(pattern, str):
        return "it is not a string"
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        said = exc.args[0] if exc.args else ""
        return said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)
    return None


def pattern_search(pattern: Any, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (RE2: linear in the text)."""
    if not isinstance(pattern, str):
        raise PatternRefused("a pattern that is not a string")
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error:
        raise PatternRefused(f"the pattern {pattern!r} cannot run on RE2"[:500]) from None
    # Bytes, not str: JSON may carry a lone surrogate, which UTF-8 cannot encode strictly.
    return compiled.search(text.encode("utf-8", "surrogatepass")) is not None


def _regex_format(instance: object) -> bool:
    return not isinstance(instance, str) or pattern_problem(instance) is None


# --- the keywords that run patterns (jsonschema 4's, with RE2 for re) -----------------------


def _error(message: str) -> Any:
    import jsonschema.exceptions  # noqa: PLC0415 (on first use: the web process rarely needs it)

    return jsonschema.exceptions.ValidationError(message)


def _extras_msg(extras: list[Any]) -> tuple[str, str]:
    return ", ".join(repr(extra) for extra in extras), "was" if len(extras) == 1 else "were"


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not pattern_search(pattern, instance):
        yield _error(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if pattern_search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict[str, Any], schema: Any) -> Iterator[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for name in instance:
        if name not in properties and not any(pattern_search(p, name) for p in patterns):
            yield name


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield _error(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            message = "Additional properties are not allowed (%s %s unexpected)"
            yield _error(message % _extras_msg(sorted(extras, key=str)))


def _evaluated_keys(validator: Any, instance: Any, schema: Any, legacy: bool) -> list[str]:
    """jsonschema's ``find_evaluated_property_keys_by_schema`` (``legacy``: its draft 2019-09
    variant, as that draft's validator runs it), patterns on RE2."""
    if validator.is_type(schema, "boolean"):
        return []
    return [
        *_referenced_keys(validator, instance, schema, legacy),
        *_own_keys(validator, instance, schema, legacy),
        *_applied_keys(validator, instance, schema, legacy),
    ]


def _referenced_keys(validator: Any, instance: Any, schema: Any, legacy: bool) -> list[str]:
    """The keys evaluated by what the schema's references resolve to."""
    import referencing.jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    keys: list[str] = []
    targets = []
    if (ref := schema.get("$ref")) is not None:
        targets.append(validator._resolver.lookup(ref))
    if legacy and "$recursiveRef" in schema:
        targets.append(referencing.jsonschema.lookup_recursive_ref(validator._resolver))
    if not legacy and (dynamic := schema.get("$dynamicRef")) is not None:
        targets.append(validator._resolver.lookup(dynamic))
    for resolved in targets:
        inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
        keys += _evaluated_keys(inner, instance, resolved.contents, legacy)
    return keys


def _own_keys(validator: Any, instance: Any, schema: Any, legacy: bool) -> list[str]:
    """The keys the schema's own property keywords evaluate (properties, additional and
    unevaluated properties, pattern properties)."""
    keys: list[str] = []
    if legacy:
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            value = schema.get(keyword)
            if value is True:
                keys += instance.keys()
            elif validator.is_type(value, "object"):
                keys += [name for name in value if name in instance]
    else:
        properties = schema.get("properties")
        if validator.is_type(properties, "object"):
            keys += properties.keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            if (subschema := schema.get(keyword)) is not None:
                keys += [
                    name
                    for name, value in instance.items()
                    if next(validator.descend(value, subschema), None) is None
                ]
    for pattern in schema.get("patternProperties", {}):
        keys += [name for name in instance if pattern_search(pattern, name)]
    return keys


def _applied_keys(validator: Any, instance: Any, schema: Any, legacy: bool) -> list[str]:
    """The keys evaluated by the subschemas applied to the same instance that apply to it
    (dependentSchemas, allOf/oneOf/anyOf, if/then/else)."""
    keys: list[str] = []
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys += _evaluated_keys(validator, instance, subschema, legacy)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if next(validator.descend(instance, subschema), None) is None:
                keys += _evaluated_keys(validator, instance, subschema, legacy)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys += _evaluated_keys(validator, instance, schema["if"], legacy)
            if "then" in schema:
                keys += _evaluated_keys(validator, instance, schema["then"], legacy)
        elif "else" in schema:
            keys += _evaluated_keys(validator, instance, schema["else"], legacy)
    return keys


def _unevaluated_properties(legacy: bool) -> Any:
    def unevaluated_properties(validator: Any, uP: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated_keys(validator, instance, schema, legacy)
        unevaluated = [
            name
            for name in instance
            if name not in evaluated
            and next(validator.descend(instance[name], uP, path=name, schema_path=name), None)
            is not None
        ]
        if not unevaluated:
            return
        if uP is False:
            message = "Unevaluated properties are not allowed (%s %s unexpected)"
            yield _error(message % _extras_msg(sorted(unevaluated, key=str)))
        else:
            message = (
                "Unevaluated properties are not valid under the given schema "
                "(%s %s unevaluated and invalid)"
            )
            yield _error(message % _extras_msg(unevaluated))

    return unevaluated_properties


_RE2_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


# --- the one factory ------------------------------------------------------------------------


@functools.cache
def local_registry() -> Any:
    """Resolves references inside the schema and the shipped metaschemas, and retrieves
    nothing (jsonschema adds its bundled metaschemas to a registry it is given)."""
    import referencing  # noqa: PLC0415 (on first use: the web process rarely needs it)

    return referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


def _refuse_retrieval(uri: str) -> Any:
    import referencing.exceptions  # noqa: PLC0415 (on first use: the web process rarely needs it)

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def validator_class(schema: Any, *, strict_integers: bool = False) -> Any:
    """The validator class for ``schema`` (its ``$schema``'s draft, 2020-12 when it names
    none), patterns on RE2. ``strict_integers``: "integer" is a JSON integer only (5.0 is
    refused), for the parameters of our tools, which are hashed and stored exactly as sent."""
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    return _extended(jsonschema.validators.validator_for(schema), strict_integers)


def _json_integer(_checker: Any, value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def _extended(draft: Any, strict_integers: bool) -> Any:
    import attrs  # noqa: PLC0415 (on first use, with jsonschema, which depends on it)
    import jsonschema  # noqa: PLC0415 (on first use: the web process rarely needs it)

    keywords: dict[str, Any] = {k: f for k, f in _RE2_KEYWORDS.items() if k in draft.VALIDATORS}
    if "unevaluatedProperties" in draft.VALIDATORS:
        # 2019-09 is the draft with $recursiveRef; its validator keeps an older algorithm.
        keywords["unevaluatedProperties"] = _unevaluated_properties(
            "$recursiveRef" in draft.VALIDATORS
        )
    formats = jsonschema.FormatChecker(formats=())
    formats.checkers.update(draft.FORMAT_CHECKER.checkers)
    formats.checks("regex", raises=re2.error)(_regex_format)
    types = draft.TYPE_CHECKER.redefine("integer", _json_integer) if strict_integers else None
    cls = jsonschema.validators.extend(
        draft, validators=keywords, type_checker=types, format_checker=formats
    )
    init_fields = [(f.name, f.alias) for f in attrs.fields(cls) if f.init]

    def evolve(self: Any, **changes: Any) -> Any:
        # jsonschema's evolve, but a subschema naming a draft gets that draft's class from here.
        schema = changes.setdefault("schema", self.schema)
        target = _extended(
            jsonschema.validators.validator_for(schema, default=draft), strict_integers
        )
        for name, alias in init_fields:
            if alias not in changes:
                changes[alias] = getattr(self, name)
        return target(**changes)

    cls.evolve = evolve
    return cls


def metaschema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not valid against its draft's metaschema (the first error, as
    ``check_schema`` says it), or None; checked by these validators, patterns on RE2."""
    cls = validator_class(schema)
    meta_cls = validator_class(cls.META_SCHEMA)
    checker = meta_cls(
        cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER, registry=local_registry()
    )
    for error in checker.iter_errors(schema):
        return str(error.message)
    return None
