"""Structured final answers (pure): an agent's ``output_schema`` bounded and checked, the
request that asks for it, and the check of the answer with its one repair round.

A tool agent with ``output_schema`` ends with a JSON object valid against the schema, in
``result.data``. A profile that supports ``response_format: json_schema`` is sent the schema
with every request (the model's final text is then JSON); any other profile is told in the
system prompt. Either way the answer is checked after the fact: the first invalid answer gets
one repair round (a hidden user message naming the problem), a second one ends the run with
``stop_reason: output_invalid``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from shared.agent.arguments import loads_tolerant
from shared.agent.messages import Message

__all__ = [
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "OUTPUT_INVALID",
    "REPAIR_KIND",
    "Checked",
    "check_answer",
    "check_output_schema",
    "output_instruction",
    "parse_output",
    "json_depth",
    "repair_message",
    "response_format",
]

MAX_SCHEMA_BYTES = 32_000  # as JSON text: the schema goes into every request
MAX_SCHEMA_DEPTH = 16  # nesting of objects and arrays
OUTPUT_INVALID = "output_invalid"
REPAIR_KIND = "output_repair"
_MAX_ERRORS_SHOWN = 3
_MAX_PROBLEM_CHARS = 600


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests objects and arrays (a scalar: 0), without recursion: the
    value may come from a hostile server."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack += [(child, depth + 1) for child in item if isinstance(child, dict | list)]
    return deepest


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def check_output_schema(schema: Mapping[str, Any]) -> None:
    """ValueError unless ``schema`` is a JSON Schema (2020-12) for an object, at most
    ``MAX_SCHEMA_BYTES`` as JSON and ``MAX_SCHEMA_DEPTH`` deep, whose ``$ref``s stay inside
    it (nothing is fetched)."""
    size = len(json.dumps(schema, ensure_ascii=False))
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"output_schema is {size} bytes; at most {MAX_SCHEMA_BYTES}")
    if json_depth(schema) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"output_schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if schema.get("type") != "object":
        raise ValueError('output_schema must describe an object ("type": "object")')
    outside = sorted({r for r in _refs(schema) if not r.startswith("#")})
    if outside:
        raise ValueError(f"output_schema: only local $ref ('#/...') are allowed, not {outside[0]}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"output_schema is not a valid JSON Schema: {exc.message}") from None
    _resolve_refs(schema)


_ROOT = "urn:treadle:output-schema"


def _resolve_refs(schema: Mapping[str, Any]) -> None:
    """ValueError for a local ``$ref`` that points at nothing (``#/$defs/missing``): caught
    at submit, not at the first answer."""
    registry = Registry().with_resource(_ROOT, DRAFT202012.create_resource(dict(schema)))
    resolver = registry.resolver(base_uri=_ROOT)
    for ref in sorted(set(_refs(schema))):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(f"output_schema: $ref {ref!r} points at nothing in it") from None


def response_format(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``response_format`` for a profile that supports json_schema (``json_schema: true``)."""
    return {"type": "json_schema", "json_schema": {"name": "final_answer", "schema": dict(schema)}}


def output_instruction(schema: Mapping[str, Any]) -> str:
    """The system prompt's part: what the final answer must be."""
    return (
        "When you give your final answer (no more tool calls), reply with only a JSON object "
        "valid against this JSON Schema, without prose or code fences:\n"
        + json.dumps(schema, ensure_ascii=False)
    )


def parse_output(text: str, schema: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The answer as an object valid against ``schema`` and "", or None and the problem."""
    try:
        value = loads_tolerant(_unfenced(text))
    except ValueError as exc:
        return None, f"the answer is not a JSON object ({exc})"
    if not isinstance(value, dict):
        return None, "the answer is JSON but not an object"
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return value, ""
    parts = [f"{_path(e.absolute_path)}: {e.message}" for e in errors[:_MAX_ERRORS_SHOWN]]
    if len(errors) > _MAX_ERRORS_SHOWN:
        parts.append(f"and {len(errors) - _MAX_ERRORS_SHOWN} more")
    return None, "; ".join(parts)[:_MAX_PROBLEM_CHARS]


def _unfenced(text: str) -> str:
    """The text without a surrounding Markdown code fence."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```"):
        body = body[3:-3]
        first, _, rest = body.partition("\n")
        return rest if first.strip().isalpha() or not first.strip() else body
    return body


def _path(path: Any) -> str:
    return "/".join(str(p) for p in path) or "(root)"


def repair_message(problem: str) -> Message:
    """The repair round's prompt: a hidden user message naming the problem."""
    return Message(
        role="user",
        content=(
            f"Your final answer does not match the required JSON Schema: {problem}. "
            "Reply again with only the corrected JSON object."
        ),
        hidden=True,
        kind=REPAIR_KIND,
    )


@dataclass(frozen=True, slots=True)
class Checked:
    """What a final answer comes to: ``data`` (valid), a ``repair`` round to run, or
    ``problem`` (invalid after the repair round: the run ends ``output_invalid``)."""

    data: dict[str, Any] | None = None
    repair: Message | None = None
    problem: str = ""


def check_answer(text: str, schema: Mapping[str, Any], *, repaired: bool) -> Checked:
    """Check a final answer; ``repaired``: the run already had its repair round."""
    data, problem = parse_output(text, schema)
    if data is not None:
        return Checked(data=data)
    if repaired:
        return Checked(problem=problem)
    return Checked(repair=repair_message(problem), problem=problem)
