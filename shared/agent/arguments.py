"""Tool-call arguments: tolerant parsing and a small JSON-schema check (SPEC L-5).

Models emit arguments as JSON text, not always valid: a code fence around it, a trailing
comma, single quotes, prose before it. ``parse_arguments`` tries strict JSON first, then json5
on the first balanced ``{...}``. ``validate_against_schema`` checks the parsed object against
the subset of JSON Schema that tool definitions use and returns a short message, or ``None``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import json5

__all__ = [
    "ArgumentsError",
    "find_balanced",
    "invalid_arguments_text",
    "loads_tolerant",
    "parse_arguments",
    "tool_error_text",
    "tool_not_found_text",
    "validate_against_schema",
]

_PAIRS = {"{": "}", "[": "]"}


class ArgumentsError(ValueError):
    """Tool-call arguments that cannot be read as a JSON object. ``str(err)`` is short."""


def tool_error_text(message: str) -> str:
    """SPEC L-5: the result of a tool that raised."""
    return f"Tool error: {message}"


def tool_not_found_text(name: str) -> str:
    """SPEC L-5: the result of a call to a tool that is not in the catalog."""
    return f"Tool not found: {name}"


def invalid_arguments_text(name: str, error: str) -> str:
    """SPEC L-5: the result of a call whose arguments cannot be parsed or fail the schema."""
    return f"Invalid arguments for {name}: {error}"


def find_balanced(text: str, opener: str = "{") -> str | None:
    """The first balanced ``{...}`` (or ``[...]``) in ``text``, aware of quoted strings.

    Quotes are tracked only inside the candidate, so an apostrophe in prose before it does no
    harm. ``None`` when there is no opener or it is never closed.
    """
    start = text.find(opener)
    if start < 0:
        return None
    end = _closing(text, start, opener, _PAIRS[opener])
    return None if end is None else text[start : end + 1]


def _closing(text: str, start: int, opener: str, closer: str) -> int | None:
    """Where the block opened at ``start`` closes (skipping quoted strings), or None."""
    depth = 0
    quote: str | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote is not None:
            quote, escaped = _quoted(ch, quote, escaped)
            continue
        if ch in ('"', "'"):
            quote = ch
        elif ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
            if depth == 0:
                return i
    return None


def _quoted(ch: str, quote: str, escaped: bool) -> tuple[str | None, bool]:
    """One character inside a quoted string: the quote still open (None: it closed here) and
    whether the next character is escaped."""
    if escaped:
        return quote, False
    if ch == "\\":
        return quote, True
    return (None if ch == quote else quote), False


def loads_tolerant(text: str, opener: str = "{") -> Any:
    """Strict JSON of the whole text, else json5 of the first balanced block.

    Raises ``ValueError`` when neither parses.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    block = find_balanced(text, opener)
    if block is None:
        raise ValueError(f"no JSON {'object' if opener == '{' else 'array'} found")
    try:
        return json5.loads(block)
    except Exception as exc:  # json5 raises ValueError, and others on odd input
        raise ValueError(_short(str(exc)) or "not valid JSON") from exc


def parse_arguments(raw: str) -> dict[str, Any]:
    """SPEC L-5: the arguments of a tool call as a dict.

    Empty text and JSON ``null`` mean ``{}`` (SPEC M-4). A JSON string holding an object
    (double-encoded arguments) is unwrapped once. Raises ``ArgumentsError`` with a short
    message otherwise.
    """
    text = (raw or "").strip()
    if not text:
        return {}
    try:
        value = loads_tolerant(text)
    except ValueError as exc:
        raise ArgumentsError(f"not valid JSON ({exc})") from None
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = loads_tolerant(value.strip())
        except ValueError as exc:
            raise ArgumentsError(f"not valid JSON ({exc})") from None
    if value is None:
        return {}  # "null" from a model calling a tool that takes no arguments
    if not isinstance(value, dict):
        raise ArgumentsError(f"expected a JSON object, got {_json_type(value)}")
    return value


def validate_against_schema(args: Any, schema: Mapping[str, Any]) -> str | None:
    """SPEC L-5: a short message saying why ``args`` fails ``schema``, or ``None`` if it passes.

    Understands ``type`` (one or a list: object, string, number, integer, boolean, array,
    null), ``properties``, ``required``, ``additionalProperties: false``, ``enum``, ``const``,
    ``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``, ``minimum``/``maximum``.
    Other keywords are ignored (accepted).
    """
    return _check(args, schema, "")


def _check(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    where = f"'{path}'" if path else "arguments"
    error = _check_value(value, schema, where)
    if error is not None:
        return error
    if isinstance(value, dict):
        return _check_object(value, schema, path)
    if isinstance(value, list):
        return _check_array(value, schema, path)
    if isinstance(value, str):
        return _check_string(value, schema, where)
    if _is_number(value):
        return _check_number(value, schema, where)
    return None


def _check_value(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    """``type``, ``enum`` and ``const``: what any value is checked against."""
    expected = schema.get("type")
    if expected is not None:
        types = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is_type(value, t) for t in types):
            return f"{where} must be {_type_phrase(types)}, got {_json_type(value)}"
    if "enum" in schema and isinstance(schema["enum"], Sequence):
        options = list(schema["enum"])
        if not any(_same(value, o) for o in options):
            shown = ", ".join(json.dumps(o, ensure_ascii=False) for o in options)
            return f"{where} must be one of: {shown}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{where} must be {json.dumps(schema['const'], ensure_ascii=False)}"
    return None


def _check_string(value: str, schema: Mapping[str, Any], where: str) -> str | None:
    if "minLength" in schema and len(value) < int(schema["minLength"]):
        return f"{where} must have at least {schema['minLength']} character(s)"
    if "maxLength" in schema and len(value) > int(schema["maxLength"]):
        return f"{where} must have at most {schema['maxLength']} character(s)"
    return None


def _check_number(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    if "minimum" in schema and value < schema["minimum"]:
        return f"{where} must be >= {schema['minimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"{where} must be <= {schema['maximum']}"
    return None


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> str | None:
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    for name in schema.get("required") or ():
        if name not in value:
            return f"missing required field '{_join(path, str(name))}'"
    if schema.get("additionalProperties") is False:
        extra = sorted(k for k in value if k not in props)
        if extra:
            return f"unknown field '{_join(path, extra[0])}'"
    for name, sub in props.items():
        if name in value and isinstance(sub, Mapping):
            error = _check(value[name], sub, _join(path, str(name)))
            if error:
                return error
    return None


def _check_array(value: list[Any], schema: Mapping[str, Any], path: str) -> str | None:
    where = f"'{path}'" if path else "arguments"
    if "minItems" in schema and len(value) < int(schema["minItems"]):
        return f"{where} must have at least {schema['minItems']} item(s)"
    if "maxItems" in schema and len(value) > int(schema["maxItems"]):
        return f"{where} must have at most {schema['maxItems']} item(s)"
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            error = _check(item, items, f"{path}[{i}]")
            if error:
                return error
    return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_CLASSES: dict[str, type] = {
    "boolean": bool,  # first: a bool is an int too
    "integer": int,
    "number": float,
    "string": str,
    "array": list,
    "object": dict,
}
"""A JSON type's Python class, as ``json`` decodes it (``number``: also an int)."""


def _is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "number":
        return _is_number(value) and math.isfinite(value)
    if name == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    cls = _CLASSES.get(name)
    return cls is None or isinstance(value, cls)  # an unknown type name restricts nothing


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def _type_phrase(types: list[Any]) -> str:
    words = {
        "object": "an object",
        "array": "an array",
        "string": "a string",
        "boolean": "a boolean",
        "null": "null",
        "number": "a number",
        "integer": "an integer",
    }
    return " or ".join(words.get(str(t), str(t)) for t in types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return next((n for n, cls in _CLASSES.items() if isinstance(value, cls)), type(value).__name__)


def _short(message: str, limit: int = 120) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
