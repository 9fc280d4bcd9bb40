"""The NUL rule, checked and documented from one place.

PostgreSQL text (and JSONB) cannot hold a NUL character, so the API refuses it: in any string
or key of a JSON body (``scheduler.http.bodyguard``, before any route; a multipart form states
and checks it where its route takes text, ``scheduler.http.datasets``). ``state_in_schema``
says the same in the OpenAPI document, so a client (or a fuzzer) reads what is checked:

* every string of a JSON request body carries ``NUL_FREE`` (a second ``pattern``, in an
  ``allOf``, when it has one of its own that admits NUL; nothing when its own pattern, ``enum``,
  ``const`` or ``format`` excludes NUL already);
* every key of an object that takes keys of its own (a ``dict``, an open model) carries it as
  ``propertyNames``;
* a value of any type (``{}``, a ``dict``'s values) is ``NulFreeJson``: any JSON value whose
  strings and keys hold no NUL;
* a header the API documents carries ``NUL_FREE`` too: HTTP itself has no NUL in a header value
  (RFC 9110; the server answers 400 before the app). Path and query strings exclude every
  control character (``scheduler.http.openapi.NO_CONTROL``, the body guard's other rule).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from re import _parser  # type: ignore[attr-defined]  # to see whether a pattern admits NUL
from typing import Any

__all__ = ["NUL", "NUL_FREE", "NULFREE_JSON", "admits_nul", "state_in_schema"]

NUL = "\x00"
NUL_FREE = r"^[^\u0000]*$"
"""A string without NUL, as a JSON Schema ``pattern``."""
NULFREE_JSON = "NulFreeJson"
_JSON_REF = {"$ref": f"#/components/schemas/{NULFREE_JSON}"}
_NAMES = {"pattern": NUL_FREE}
_NOTES = frozenset({"title", "description", "default", "examples", "deprecated"})
# formats whose every valid string is free of NUL
_NUL_FREE_FORMATS = frozenset(
    {"date-time", "date", "time", "duration", "uuid", "email", "uri", "byte"}
)
_VALUES = ("anyOf", "oneOf", "allOf")


def _json_value() -> dict[str, Any]:
    return {
        "description": "Any JSON value without a NUL character in a string or a key",
        "anyOf": [
            {"type": "string", "pattern": NUL_FREE},
            {"type": ["number", "boolean", "null"]},
            {"type": "array", "items": dict(_JSON_REF)},
            {"type": "object", "propertyNames": dict(_NAMES), "additionalProperties": _JSON_REF},
        ],
    }


def admits_nul(pattern: str) -> bool:
    """Can a string holding NUL match ``pattern``? True when unsure (an unknown construct)."""
    try:
        parsed = list(_parser.parse(pattern))
    except (re.error, ValueError, TypeError):
        return True
    return not _anchored(parsed) or any(_matches_nul(op, arg) for op, arg in _walk(parsed))


def _anchored(items: list[Any]) -> bool:
    """Does the pattern hold the whole string (``^...$``, each branch so)? A pattern matches
    anywhere in a string: unanchored, it admits whatever surrounds its match."""
    return _at(items, 0, "AT_BEGIN") and _at(items, -1, "AT_END")


def _at(items: list[Any], end: int, anchor: str) -> bool:
    """Is the sequence's first (``end`` 0) or last (-1) item the anchor, in every branch?"""
    if not items:
        return False
    op, arg = items[end]
    if str(op) == "AT":
        return str(arg).startswith(anchor)
    if str(op) == "BRANCH":
        return all(_at(list(branch), end, anchor) for branch in arg[1])
    if str(op) == "SUBPATTERN":
        return _at(list(arg[-1]), end, anchor)
    return False


def _walk(items: Any) -> Iterator[tuple[str, Any]]:
    for op, arg in items:
        name = str(op)
        if name in ("ASSERT", "ASSERT_NOT"):
            continue  # a look-around consumes nothing
        if name == "SUBPATTERN":
            yield from _walk(arg[-1])
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            yield from _walk(arg[2])
        elif name == "BRANCH":
            for branch in arg[1]:
                yield from _walk(branch)
        elif name == "ATOMIC_GROUP":
            yield from _walk(arg)
        else:
            yield name, arg


def _matches_nul(name: str, arg: Any) -> bool:
    if name in ("AT", "GROUPREF", "GROUPREF_EXISTS"):
        return name != "AT"  # an anchor consumes nothing; a back-reference: unsure
    if name == "LITERAL":
        return bool(arg == 0)
    if name == "NOT_LITERAL":
        return bool(arg != 0)
    if name == "IN":
        return _class_has_nul(arg)
    return True  # ANY, or a construct this does not know


def _class_has_nul(items: Any) -> bool:
    negate = any(str(op) == "NEGATE" for op, _ in items)
    listed = False
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            listed |= arg == 0
        elif name == "RANGE":
            listed |= arg[0] == 0
        elif name == "CATEGORY":
            listed |= str(arg).startswith("CATEGORY_NOT_")  # \D \W \S hold NUL
    return listed != negate


def _string(node: dict[str, Any]) -> None:
    if "enum" in node or "const" in node:
        return
    if node.get("format") in _NUL_FREE_FORMATS:
        return
    own = node.get("pattern")
    if own is None:
        node["pattern"] = NUL_FREE
    elif admits_nul(own) and {"pattern": NUL_FREE} not in node.get("allOf", []):
        node.setdefault("allOf", []).append({"pattern": NUL_FREE})


def _open_object(node: dict[str, Any]) -> None:
    """Keys of the object's own: NUL-free names, values of any type free of NUL."""
    extra = node.get("additionalProperties", True)
    keys_free = extra is not False or any(admits_nul(p) for p in node.get("patternProperties", {}))
    if keys_free and "propertyNames" not in node:
        node["propertyNames"] = dict(_NAMES)
    if extra is True:
        node["additionalProperties"] = dict(_JSON_REF)


def _is_any(node: dict[str, Any]) -> bool:
    return not (set(node) - _NOTES)


class _Walk:
    """One pass over what the API reads: each component once, each value position."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = components
        self.seen: set[str] = set()

    def value(self, node: Any) -> None:
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            self._component(ref)
            return
        if _is_any(node):
            node.update(_JSON_REF)
            return
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "string" in kinds:
            _string(node)
        if "object" in kinds:
            _open_object(node)
        if "array" in kinds and "items" not in node and "prefixItems" not in node:
            node["items"] = dict(_JSON_REF)
        self._children(node)

    def _children(self, node: dict[str, Any]) -> None:
        for child in (node.get("properties") or {}).values():
            self.value(child)
        for child in (node.get("patternProperties") or {}).values():
            self.value(child)
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), dict):
                self.value(node[key])
        for child in node.get("prefixItems") or ():
            self.value(child)
        for key in _VALUES:
            for child in node.get(key) or ():
                self.value(child)

    def _component(self, ref: str) -> None:
        name = ref.rsplit("/", 1)[-1]
        if name in self.seen or name not in self.components:
            return
        self.seen.add(name)
        self.value(self.components[name])


def state_in_schema(document: dict[str, Any]) -> None:
    """Write the NUL rule into every JSON request body and documented header of an OpenAPI
    ``document`` (see the module doc); multipart bodies state it where their routes check it."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    components[NULFREE_JSON] = _json_value()
    walk = _Walk(components)
    for item in document.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict):
                for schema in _guarded(operation):
                    walk.value(schema)


def _guarded(operation: dict[str, Any]) -> Iterator[Any]:
    """The schemas of an operation's headers and JSON bodies."""
    for param in operation.get("parameters") or ():
        if param.get("in") == "header":
            yield param.get("schema")
    content = (operation.get("requestBody") or {}).get("content") or {}
    for media, body in content.items():
        if not media.startswith("multipart/"):
            yield body.get("schema")
