"""Long-term memory, the pure part: namespaces and their templates, the text an item is
searched by, filters on item values, keyword scores (docs/memory.md).

A namespace is a tuple of labels (``("users", "u1", "facts")``): each 1-64 characters, no
``.`` (LangGraph's rule: the labels are joined by dots on the wire and in the store) and no
control character; all of them together at most ``NAMESPACE_CHARS``. An agent's namespace is
a template whose labels may hold ``{placeholders}`` filled from the run's metadata
(``["users", "{user_id}"]``). Errors are ``ValueError`` (the engine turns them into 4xx).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from shared.agent.knowledge import Query, search_text

__all__ = [
    "KEY_CHARS",
    "LABEL_CHARS",
    "NAMESPACE_CHARS",
    "NAMESPACE_DEPTH",
    "OPERATORS",
    "SEPARATOR",
    "check_filter",
    "check_key",
    "check_namespace",
    "item_text",
    "join_namespace",
    "keyword_score",
    "matches_filter",
    "render_namespace",
    "split_namespace",
    "template_fields",
]

SEPARATOR = "."
LABEL_CHARS = 64
NAMESPACE_DEPTH = 8  # labels, at most (a setting may lower it)
KEY_CHARS = 256  # a key's characters, at most (a setting may lower it)
NAMESPACE_CHARS = NAMESPACE_DEPTH * (LABEL_CHARS + 1)
TEXT_CHARS = 20_000  # the text of a value that search reads, at most
_LABEL = re.compile(r"^[^.\x00-\x1f\x7f]{1,64}$")
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_WORD = re.compile(r"\w+", re.UNICODE)
OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"})


def check_namespace(
    labels: Sequence[str], max_depth: int, *, prefix: bool = False
) -> tuple[str, ...]:
    """The labels as a tuple; ValueError when one is bad, there are none (an empty prefix
    is allowed), or too many."""
    out = tuple(labels)
    if not out and not prefix:
        raise ValueError("a namespace needs at least one label")
    if len(out) > max_depth:
        raise ValueError(f"a namespace has at most {max_depth} labels, not {len(out)}")
    for label in out:
        if not isinstance(label, str) or not _LABEL.match(label):
            raise ValueError(
                f"namespace label {str(label)[:80]!r}: 1-{LABEL_CHARS} characters, "
                "no '.' and no control characters"
            )
    if len(join_namespace(out)) > NAMESPACE_CHARS:
        raise ValueError(f"a namespace is at most {NAMESPACE_CHARS} characters")
    return out


def check_key(key: str, max_chars: int) -> str:
    if not key or len(key) > max_chars:
        raise ValueError(f"a key is 1-{max_chars} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError("a key has no control characters")
    return key


def join_namespace(labels: Sequence[str]) -> str:
    return SEPARATOR.join(labels)


def split_namespace(path: str) -> list[str]:
    return path.split(SEPARATOR) if path else []


def template_fields(template: Sequence[str]) -> set[str]:
    """The metadata fields a namespace template names (``{user_id}`` → ``user_id``)."""
    return {m.group(1) for label in template for m in _FIELD.finditer(label)}


def render_namespace(template: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """Fill each label's ``{field}`` from ``values`` (a run's metadata): a string or a
    number; ValueError when one is missing or of another type."""

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"the memory namespace needs metadata.{name} (a string or an integer)")
        return str(value)

    return [_FIELD.sub(fill, label) for label in template]


def item_text(value: Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """What search reads of a value: the given fields (dotted paths), else every string
    and number in it, in order; at most ``TEXT_CHARS`` characters."""
    parts = [_leaves(_at(value, f)) for f in fields] if fields is not None else [_leaves(value)]
    return " ".join(p for p in parts if p)[:TEXT_CHARS]


def _at(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _leaves(value: Any) -> str:
    out: list[str] = []
    stack = [value]
    while stack:  # iteratively: a value is at most 64 levels deep (the API's body guard)
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            out.append(json.dumps(item))
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return " ".join(out)


def _operators(cond: Any) -> bool:
    return isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond)


def check_filter(flt: Mapping[str, Any] | None) -> None:
    """ValueError for an unknown operator (a condition with a ``$`` key holds operators
    only), or ``$in`` / ``$nin`` without a list."""
    for cond in (flt or {}).values():
        if _operators(cond):
            for op, arg in cond.items():
                if op not in OPERATORS:
                    known = ", ".join(sorted(OPERATORS))
                    raise ValueError(f"unknown filter operator {op!r}; one of {known}")
                if op in ("$in", "$nin") and not isinstance(arg, list):
                    raise ValueError(f"{op} takes a list")


def matches_filter(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """LangGraph's store filter: ``{field: value}`` is equality; ``{field: {"$gt": 3}}``
    compares (``$eq $ne $gt $gte $lt $lte $in $nin``); a dotted field reads nested values.
    The filter was checked (``check_filter``)."""
    for field, cond in (flt or {}).items():
        actual = _at(value, field)
        if _operators(cond):
            if not all(_compare(actual, str(op), arg) for op, arg in cond.items()):
                return False
        elif actual != cond:
            return False
    return True


def _compare(actual: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(actual == arg)
    if op == "$ne":
        return bool(actual != arg)
    if op in ("$in", "$nin"):
        return (actual in arg) == (op == "$in")
    try:
        if op == "$gt":
            return bool(actual > arg)
        if op == "$gte":
            return bool(actual >= arg)
        if op == "$lt":
            return bool(actual < arg)
        return bool(actual <= arg)
    except TypeError:  # incomparable (a string against a number, a missing field)
        return False


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(search_text(text))}


def _stem(word: str) -> str:
    return word[:5] if len(word) > 5 else word  # "refunds" meets "refund"


def keyword_score(query: Query, text: str) -> float:
    """How well ``text`` matches the query: the share of its words and phrases found (a
    crude stem: the first five letters), 0 when an excluded word is in it."""
    words = _words(text)
    stems = {_stem(w) for w in words}
    if any(w.lower() in words for w in query.excluded):
        return 0.0
    terms = [w.lower() for w in query.words]
    hits = sum(1 for w in terms if w in words or _stem(w) in stems)
    low = " ".join(_WORD.findall(search_text(text).lower()))
    hits += sum(2 for p in query.phrases if " ".join(t.lower() for t in p) in low)
    total = len(terms) + 2 * len(query.phrases)
    return hits / total if total else 0.0
