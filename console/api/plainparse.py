"""A request serializer's plain form: the same rules, read off its DRF fields once per process,
checked without building the serializer (DRF deep-copies every declared field for each
instance: a proposal spent about a tenth of the web's CPU there).

The plain form only accepts: for a body it is not sure of (a wrong type, a value out of bounds,
a missing required field, anything a field would coerce) it says so, and the caller runs the
serializer, whose errors are the contract's. It never refuses and never decides an error's
wording. Built only for serializers made of the fields it knows (``Text``, ``Int``, DRF's
``ChoiceField``, ``FloatField`` and ``DictField`` of those or of anything), whose validators are
the ones their arguments add, with no ``validate`` or ``validate_<field>`` of their own; any other
serializer has no plain form. ``tests/api/test_plain_parse.py`` checks, over generated bodies,
that whatever the plain form accepts the serializer validates to the same data."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from django.core.validators import (
    MaxLengthValidator,
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
    ProhibitNullCharactersValidator,
)
from rest_framework import serializers
from rest_framework.fields import _UnvalidatedField, empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator


class NotPlain(Exception):
    """The plain form is not sure of this body: the serializer decides."""


Check = Callable[[Any], Any]
Form = Callable[[dict[str, Any]], dict[str, Any]]

# What DRF's CharField validators refuse: a NUL, or a surrogate code point.
_REFUSED_CHARACTERS = re.compile("[\x00\ud800-\udfff]")
_KNOWN_VALIDATORS = (
    MaxLengthValidator,
    MinLengthValidator,
    MaxValueValidator,
    MinValueValidator,
    ProhibitNullCharactersValidator,
    ProhibitSurrogateCharactersValidator,
)


def _rules_from_arguments(field: serializers.Field) -> None:
    """Refuse (NotPlain: no plain form) a field with a validator its arguments did not add: a
    rule of its own, which only the serializer runs."""
    for validator in field.validators:
        if not isinstance(validator, _KNOWN_VALIDATORS):
            raise NotPlain
        if callable(getattr(validator, "limit_value", None)):
            raise NotPlain


def _text(field: Any) -> Check:
    _rules_from_arguments(field)
    shortest, longest = field.min_length, field.max_length
    if field.trim_whitespace:
        raise NotPlain  # it would change the value: only the serializer does that

    def check(value: Any) -> Any:
        if type(value) is not str:
            raise NotPlain
        if value == "":
            if not field.allow_blank:
                raise NotPlain
            return value
        if (longest is not None and len(value) > longest) or (
            shortest is not None and len(value) < shortest
        ):
            raise NotPlain
        if _REFUSED_CHARACTERS.search(value):
            raise NotPlain
        return value

    return check


def _number(kind: type, field: Any) -> Check:
    _rules_from_arguments(field)
    low, high = field.min_value, field.max_value

    def check(value: Any) -> Any:
        if type(value) is int:
            try:
                out = kind(value)
            except OverflowError:  # an integer no float holds
                raise NotPlain from None
        elif type(value) is float and kind is float and math.isfinite(value):
            out = value
        else:
            raise NotPlain
        if (low is not None and out < low) or (high is not None and out > high):
            raise NotPlain
        return out

    return check


def _choice(field: Any) -> Check:
    _rules_from_arguments(field)
    choices = dict(field.choice_strings_to_values)
    if "" in choices and not field.allow_blank:
        raise NotPlain

    def check(value: Any) -> Any:
        if type(value) is not str or value not in choices:
            raise NotPlain
        return choices[value]

    return check


def _dict(field: Any) -> Check:
    _rules_from_arguments(field)
    child = field.child
    each = None if type(child) is _UnvalidatedField else _value_check(child)

    def check(value: Any) -> Any:
        if type(value) is not dict or (not field.allow_empty and not value):
            raise NotPlain
        if each is None:
            return {str(k): v for k, v in value.items()}
        return {str(k): each(v) for k, v in value.items()}

    return check


def _value_check(field: serializers.Field) -> Check:
    """The check of one field's value (present, not None); NotPlain when the field is not one
    the plain form knows."""
    kind = type(field)
    # The contract's own field classes say which they are (console.api.serializers); a
    # subclass of theirs may change a rule, so only the class itself counts.
    plain = kind.__dict__.get("plain_kind")
    if plain == "text":
        return _text(field)
    if plain == "int":
        return _number(int, field)
    if kind is serializers.FloatField:
        return _number(float, field)
    if kind is serializers.ChoiceField:
        return _choice(field)
    if kind is serializers.DictField:
        return _dict(field)
    raise NotPlain


def _field_step(name: str, field: serializers.Field) -> Callable[[dict[str, Any], dict], None]:
    if field.read_only or field.write_only or field.source != name:
        raise NotPlain
    value_check = _value_check(field)
    required, default, nullable = field.required, field.default, field.allow_null
    if callable(default) and getattr(default, "requires_context", False):
        raise NotPlain

    def step(data: dict[str, Any], out: dict[str, Any]) -> None:
        value = data.get(name, empty)
        if value is empty:
            if required:
                raise NotPlain
            if default is not empty:
                out[name] = default() if callable(default) else default
            return
        if value is None:
            if not nullable:
                raise NotPlain
            out[name] = None
            return
        out[name] = value_check(value)

    return step


def plain_form(serializer_class: type[serializers.Serializer]) -> Form | None:
    """The plain form of ``serializer_class``, or None when it has none (built once)."""
    try:
        return _forms[serializer_class]
    except KeyError:
        pass
    form: Form | None
    try:
        form = _build(serializer_class)
    except NotPlain:
        form = None
    _forms[serializer_class] = form
    return form


_forms: dict[type, Form | None] = {}


def _build(serializer_class: type[serializers.Serializer]) -> Form:
    if serializer_class.validate is not serializers.Serializer.validate:
        raise NotPlain
    if getattr(getattr(serializer_class, "Meta", None), "validators", None):
        raise NotPlain
    fields = serializer_class().fields
    if any(hasattr(serializer_class, f"validate_{name}") for name in fields):
        raise NotPlain
    steps = [_field_step(name, field) for name, field in fields.items()]

    def form(data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for step in steps:
            step(data, out)
        return out

    return form
