"""Tolerant tool-argument parsing and schema checks (SPEC L-5)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.agent.arguments import (
    ArgumentsError,
    find_balanced,
    invalid_arguments_text,
    parse_arguments,
    tool_error_text,
    tool_not_found_text,
    validate_against_schema,
)

# SPEC L-5 texts


def test_exact_texts() -> None:
    assert tool_error_text("boom") == "Tool error: boom"
    assert tool_not_found_text("nope") == "Tool not found: nope"
    assert invalid_arguments_text("calc", "bad") == "Invalid arguments for calc: bad"


# SPEC L-5: JSON first, then json5 on the first balanced {...}


def test_valid_json() -> None:
    assert parse_arguments('{"a": 1, "b": [1, 2]}') == {"a": 1, "b": [1, 2]}


def test_empty_means_empty_object() -> None:
    # SPEC M-4: empty arguments are "{}"
    assert parse_arguments("") == {}
    assert parse_arguments("   ") == {}
    assert parse_arguments("null") == {}


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": 1,}',  # trailing comma
        "{'a': 1}",  # single quotes
        "{a: 1}",  # unquoted key
        '```json\n{"a": 1}\n```',  # code fence
        'Sure! Here are the arguments: {"a": 1} hope that helps',  # prose around it
        '{"a": 1} {"b": 2}',  # first balanced object only
        "{// comment\n a: 1}",
    ],
)
def test_tolerant_forms(raw: str) -> None:
    assert parse_arguments(raw) == {"a": 1}


def test_braces_inside_strings_do_not_confuse_the_scan() -> None:
    raw = 'call: {"text": "a } b { c", "n": 2,} trailing'
    assert parse_arguments(raw) == {"text": "a } b { c", "n": 2}


def test_apostrophe_in_prose_before_the_object() -> None:
    assert parse_arguments("here's it: {'q': \"it's\"}") == {"q": "it's"}


def test_double_encoded_object_is_unwrapped() -> None:
    assert parse_arguments('"{\\"a\\": 1}"') == {"a": 1}


@pytest.mark.parametrize("raw", ["not json at all", '{"a": ', "{a: }", "{{{"])
def test_invalid_raises_short_error(raw: str) -> None:
    with pytest.raises(ArgumentsError) as info:
        parse_arguments(raw)
    assert isinstance(info.value, ValueError)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("raw", ["[1, 2]", "42", '"text"', "true"])
def test_not_an_object_raises(raw: str) -> None:
    with pytest.raises(ArgumentsError, match="expected a JSON object"):
        parse_arguments(raw)


def test_find_balanced() -> None:
    assert find_balanced('x {"a": {"b": 1}} y') == '{"a": {"b": 1}}'
    assert find_balanced("x [1, [2]] y", "[") == "[1, [2]]"
    assert find_balanced("no object") is None
    assert find_balanced('{"never": "closed"') is None


# SPEC L-5: arguments that fail the tool's schema -> the validation message

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "count": {"type": "integer"},
        "price": {"type": "number"},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "properties": {"owner": {"type": "string"}}},
        "color": {"type": "string", "enum": ["red", "green"]},
    },
    "required": ["title"],
}


def test_valid_arguments_pass() -> None:
    args = {
        "title": "t",
        "count": 3,
        "price": 9.5,
        "urgent": False,
        "tags": ["a"],
        "meta": {"owner": "me"},
        "color": "red",
    }
    assert validate_against_schema(args, SCHEMA) is None


def test_missing_required() -> None:
    assert validate_against_schema({}, SCHEMA) == "missing required field 'title'"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"title": 5}, "'title' must be a string, got integer"),
        ({"title": "t", "count": "3"}, "'count' must be an integer"),
        ({"title": "t", "count": 2.5}, "'count' must be an integer"),
        ({"title": "t", "count": True}, "'count' must be an integer, got boolean"),
        ({"title": "t", "price": "9"}, "'price' must be a number"),
        ({"title": "t", "urgent": "yes"}, "'urgent' must be a boolean"),
        ({"title": "t", "tags": "a"}, "'tags' must be an array"),
        ({"title": "t", "tags": ["a", 1]}, "'tags[1]' must be a string"),
        ({"title": "t", "meta": {"owner": 1}}, "'meta.owner' must be a string"),
        ({"title": "t", "color": "blue"}, '\'color\' must be one of: "red", "green"'),
    ],
)
def test_type_errors(args: dict[str, Any], needle: str) -> None:
    message = validate_against_schema(args, SCHEMA)
    assert message is not None
    assert needle in message


def test_integer_accepts_integral_float_and_number_accepts_int() -> None:
    assert validate_against_schema({"title": "t", "count": 3.0, "price": 2}, SCHEMA) is None


def test_not_an_object() -> None:
    assert validate_against_schema([1], SCHEMA) == "arguments must be an object, got array"


def test_extra_keys_allowed_unless_forbidden() -> None:
    assert validate_against_schema({"title": "t", "other": 1}, SCHEMA) is None
    strict = dict(SCHEMA, additionalProperties=False)
    assert validate_against_schema({"title": "t", "other": 1}, strict) == "unknown field 'other'"


def test_nullable_type_list_and_array_bounds() -> None:
    schema = {
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"]},
            "items": {"type": "array", "minItems": 1, "maxItems": 2},
        },
    }
    assert validate_against_schema({"note": None}, schema) is None
    assert "must be a string or null" in (validate_against_schema({"note": 1}, schema) or "")
    assert "at least 1 item" in (validate_against_schema({"items": []}, schema) or "")
    assert "at most 2 item" in (validate_against_schema({"items": [1, 2, 3]}, schema) or "")


def test_empty_schema_accepts_anything() -> None:
    assert validate_against_schema({"x": 1}, {}) is None
    assert validate_against_schema({"x": 1}, {"type": "object", "properties": {}}) is None
