"""A JSON Schema from an agent cannot stall the process that checks it (issue 33): its patterns
run on RE2, never on Python's backtracking ``re`` (``^(a+)+$`` against a's and a "!" held the
GIL for minutes), a pattern RE2 cannot run is refused at definition and unavailable if stored,
and a reference that comes back to itself without descending into the document is refused at
definition and unavailable if stored (it used to end in a RecursionError).

The ``no_re`` tripwire replaces the ``re`` module inside jsonschema's keyword, format and
helper modules: any use of it on a schema's pattern fails the test at once (and cannot hang
it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.errors import InvalidInput
from runtime.jsonschemas import json_schema_compile, json_schema_validate, json_schema_verdict
from tests.conftest import ROOT

D3 = "http://json-schema.org/draft-03/schema#"
D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"
DRAFTS = [D3, D4, D6, D7, D2019, D2020]


class _Tripwire:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"jsonschema used re.{name} on a schema's pattern")


@pytest.fixture
def no_re(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import jsonschema._format
    import jsonschema._keywords
    import jsonschema._legacy_keywords
    import jsonschema._utils

    for module in (
        jsonschema._keywords,
        jsonschema._legacy_keywords,
        jsonschema._utils,
        jsonschema._format,
    ):
        monkeypatch.setattr(module, "re", _Tripwire())
    yield


def verdict(document: Any, schema: dict[str, Any]) -> tuple[str, str]:
    return json_schema_verdict([json.dumps(document).encode()], schema)


def refusal(schema: Any) -> str:
    with pytest.raises(InvalidInput) as refused:
        json_schema_validate(schema, "config.schema")
    assert refused.value.details["field"] == "config.schema"
    return refused.value.message


@pytest.mark.parametrize("draft", DRAFTS)
def test_patterns_run_on_re2_in_every_draft(no_re, draft):
    """(e) pattern, patternProperties and additionalProperties (which asks patternProperties
    what is additional) answer as before, without ``re``: a property matching a pattern is
    validated by its subschema, the others by additionalProperties."""
    schema = {
        "$schema": draft,
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
        "patternProperties": {"^x_": {"type": "integer"}, "^(n|m)um_\\d+$": {"type": "number"}},
        "additionalProperties": {"type": "string"},
    }
    json_schema_validate(schema, "config.schema")  # its metaschema's "regex" format: no re
    assert verdict({"name": "abc", "x_a": 1, "num_1": 2.5, "other": "s"}, schema) == (
        "passed",
        "",
    )
    result, reason = verdict({"name": "abc", "x_a": "one"}, schema)
    assert result == "failed" and reason.startswith("x_a:") and "integer" in reason, reason
    result, reason = verdict({"name": "abc", "other": 5}, schema)
    assert result == "failed" and reason.startswith("other:") and "string" in reason, reason
    result, reason = verdict({"name": "ABC"}, schema)
    assert result == "failed" and "does not match" in reason, reason
    closed = {**schema, "additionalProperties": False}
    result, reason = verdict({"x_a": 1, "stray": "s"}, closed)
    assert result == "failed" and "'stray' does not match any of the regexes" in reason, reason
    assert verdict({"x_a": 1, "num_2": 3}, closed)[0] == "passed"


@pytest.mark.parametrize("draft", [D2019, D2020])
def test_unevaluated_properties_ask_patterns_on_re2(no_re, draft):
    schema = {
        "$schema": draft,
        "allOf": [{"patternProperties": {"^x_": {"type": "integer"}}}],
        "properties": {"id": {"type": "string"}},
        "unevaluatedProperties": False,
    }
    json_schema_validate(schema, "config.schema")
    assert verdict({"id": "a", "x_1": 1}, schema) == ("passed", "")
    result, reason = verdict({"id": "a", "y": 1}, schema)
    assert result == "failed" and "Unevaluated properties" in reason and "'y'" in reason


def test_a_subschema_naming_another_draft_stays_on_re2(no_re):
    """jsonschema's own ``evolve`` switches to its stock class (``re``) where a subschema names
    a draft; the validators here keep their own."""
    schema = {"properties": {"x": {"$schema": D7, "pattern": "^(a+)+$"}}}
    json_schema_validate(schema, "config.schema")
    result, reason = verdict({"x": "a" * 40 + "!"}, schema)
    assert result == "failed" and "does not match" in reason, reason
    assert verdict({"x": "aaa"}, schema) == ("passed", "")


def test_a_tools_params_schema_uses_the_same_validators(no_re):
    """One factory: ``json_schema_compile`` (a tool's params_schema) runs patterns on RE2 and
    keeps "integer" a JSON integer only."""
    validator = json_schema_compile(
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "n": {"type": "integer"},
            },
        }
    )
    assert not list(validator.iter_errors({"code": "ABC", "n": 5}))
    assert [e.validator for e in validator.iter_errors({"code": "abcd", "n": 5.0})] == [
        "pattern",
        "type",
    ]


def test_the_catastrophic_pattern_is_answered_in_linear_time():
    """(a) ``^(a+)+$`` against a's and a "!": ``re`` backtracks for ever; RE2 finds no match.
    In a child process, so that a regression fails on the timeout instead of holding this one."""
    code = textwrap.dedent(
        """
        import json, django
        django.setup()
        from runtime.jsonschemas import json_schema_verdict
        schema = {"pattern": "^(a+)+$"}
        for text in ("a" * 40 + "!", "a" * 5000 + "!", "a" * 5000):
            print(json.dumps(json_schema_verdict([json.dumps(text).encode()], schema)))
        """
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a[0] for a in answers] == ["failed", "failed", "passed"], answers
    assert "does not match '^(a+)+$'" in answers[0][1]


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"properties": {"x": {"pattern": "^(a)\\1$"}}}, "pattern at /properties/x/pattern"),
        ({"pattern": "(?=a)"}, "pattern at /pattern"),
        ({"items": {"pattern": "(?<!a)b"}}, "pattern at /items/pattern"),
        ({"pattern": "end\\Z"}, "pattern at /pattern"),
        ({"patternProperties": {"^(?!x)": {}}}, "patternProperties name '^(?!x)' at"),
        ({"$defs": {"d": {"pattern": "a{1001}"}}}, "pattern at /$defs/d/pattern"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_at_definition(schema, named):
    """(b) Refused in words naming the field and the pattern's place; nothing runs them."""
    message = refusal(schema)
    assert message.startswith(f"config.schema: {named}"), message
    assert "the linear-time engine cannot run" in message and "backreferences" in message


def test_patterns_re2_runs_are_accepted(no_re):
    for pattern in ("^\\d{3}-\\w+$", "(?P<y>\\d{4})", "(?i)^abc$", "^\\p{L}+$", "\\x{263a}"):
        json_schema_validate({"pattern": pattern}, "config.schema")
    json_schema_validate({"patternProperties": {"^[a-z]+_(?:id|key)$": {}}}, "config.schema")


def test_a_stored_pattern_re2_cannot_run_is_unavailable_not_run_by_re(no_re):
    """A schema stored before the rule: unavailable, whatever the document."""
    for schema in ({"pattern": "^(a)\\1$"}, {"patternProperties": {"(?=k)": {"type": "string"}}}):
        result, reason = verdict({"k": 1}, schema)
        assert result == "unavailable" and "linear-time engine cannot run" in reason, reason
        result, reason = verdict("aa", schema)
        assert result == "unavailable", reason


CYCLES = [
    ({"$ref": "#"}, "/$ref"),
    ({"allOf": [{"$ref": "#"}]}, "/allOf/0/$ref"),
    (
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        "/$defs/",
    ),
    ({"anyOf": [{"type": "string"}, {"not": {"$ref": "#"}}]}, "/anyOf/1/not/$ref"),
    ({"if": {"$ref": "#/$defs/x"}, "$defs": {"x": {"then": {"$ref": "#"}}}}, "/"),
    ({"dependentSchemas": {"k": {"$ref": "#"}}}, "/dependentSchemas/k/$ref"),
    ({"$schema": D7, "definitions": {"a": {"oneOf": [{"$ref": "#/definitions/a"}]}}}, "/defin"),
    ({"$schema": D4, "properties": {"p": {"allOf": [{"$ref": "#/properties/p"}]}}}, "/prop"),
    ({"$dynamicAnchor": "m", "anyOf": [{"$dynamicRef": "#m"}]}, "/anyOf/0/$dynamicRef"),
    ({"$schema": D2019, "$recursiveAnchor": True, "allOf": [{"$recursiveRef": "#"}]}, "/allOf"),
    ({"$anchor": "top", "allOf": [{"$ref": "#top"}]}, "/allOf/0/$ref"),
]


@pytest.mark.parametrize(("schema", "place"), CYCLES)
def test_references_that_never_end_are_refused_at_definition(schema, place):
    """(c) Among them the issue's three: ``{"$ref": "#"}``, through allOf, and two $defs
    referring to each other. The refusal names the reference that closes the cycle."""
    message = refusal(schema)
    assert message.startswith(f"config.schema: the reference at {place}"), message
    assert "never end" in message


TREE = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
}
# A schema that recurs through keywords that descend into the document, and its twin that
# recurs in place.
RECURSIVE = [
    (TREE, {**TREE, "anyOf": [{"$ref": "#"}]}),
    (
        {"$defs": {"node": TREE}, "$ref": "#/$defs/node"},
        {"$defs": {"node": {**TREE, "not": {"$ref": "#/$defs/node"}}}, "$ref": "#/$defs/node"},
    ),
    (
        {"$dynamicAnchor": "node", "properties": {"kids": {"items": {"$dynamicRef": "#node"}}}},
        {"$dynamicAnchor": "node", "allOf": [{"$dynamicRef": "#node"}]},
    ),
    (
        {
            "$schema": D2019,
            "$recursiveAnchor": True,
            "additionalProperties": {"$recursiveRef": "#"},
        },
        {"$schema": D2019, "$recursiveAnchor": True, "else": {"$recursiveRef": "#"}},
    ),
    (
        {"propertyNames": {"$ref": "#/$defs/name"}, "$defs": {"name": {"maxLength": 9}}},
        {
            "propertyNames": {"$ref": "#/$defs/name"},
            "$defs": {"name": {"allOf": [{"$ref": "#/$defs/name"}]}},
        },
    ),
    (
        {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {}}},
        {
            "allOf": [{"$ref": "#/$defs/a"}],
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#"}},
        },
    ),
]


@pytest.mark.parametrize(("accepted", "twin"), RECURSIVE)
def test_recursion_that_descends_into_the_document_is_accepted(accepted, twin):
    """(c) The line between a recursive schema and a cycle: the same reference is fine under
    properties/items/additionalProperties/propertyNames, refused under an in-place applicator."""
    json_schema_validate(accepted, "config.schema")
    assert "never end" in refusal(twin)


def test_a_tree_schema_is_accepted_and_validates_its_documents():
    json_schema_validate(TREE, "config.schema")
    assert "never end" in refusal({**TREE, "oneOf": [{"$ref": "#"}]})
    good = {"name": "root", "children": [{"name": "a"}, {"name": "b", "children": [{"name": "c"}]}]}
    assert verdict(good, TREE) == ("passed", "")
    bad = {"name": "root", "children": [{"name": "a", "children": [{"children": []}]}]}
    result, reason = verdict(bad, TREE)
    assert result == "failed" and reason.startswith("children/0/children/0:"), reason
    assert "'name' is a required property" in reason


@pytest.mark.parametrize(("schema", "place"), CYCLES[:3])
def test_a_stored_schema_that_never_ends_is_unavailable(schema, place):
    """(d) at the verdict: unavailable, in plain words, before any document is read."""
    result, reason = verdict({"name": "x"}, schema)
    assert result == "unavailable", reason
    assert reason.startswith(f"the schema refers to itself without end (at {place}"), reason


def test_a_recursion_too_deep_to_check_is_unavailable_not_an_exception():
    """Defence in depth: a document nested deeper than the interpreter's stack under a
    legitimate recursive schema, or deeper than the JSON parser goes, is unavailable."""
    document: dict[str, Any] = {"name": "leaf"}
    # Deep enough for the validator's frames (several per level), not for the JSON parser's.
    for _ in range(sys.getrecursionlimit() // 3):
        document = {"name": "n", "children": [document]}
    text = json.dumps(document).encode()
    assert len(text) < 1_000_000
    result, reason = json_schema_verdict([text], TREE)
    assert result == "unavailable" and "refers to itself without end" in reason, reason
    result, reason = json_schema_verdict([b"[" * 100_000], TREE)
    assert (result, reason) == ("unavailable", "the document nests too deeply to check")
