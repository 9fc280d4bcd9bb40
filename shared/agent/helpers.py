"""Helper kinds: one model call each, structured output (SPEC H-1 classify, H-2 extract,
H-3 expand_query).

Each helper has a prompt builder (messages for the one call) and a parser that turns the
reply text into the result. Parsers never raise on a bad model answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared.agent.arguments import find_balanced, loads_tolerant
from shared.agent.messages import Message
from shared.agent.spec import Category, ExtractField

__all__ = [
    "DIVERSITY_RELEVANCE_WEIGHT",
    "classify_messages",
    "classify_result",
    "expand_query_messages",
    "extract_messages",
    "extract_response_format",
    "extract_schema",
    "lexical_similarity",
    "match_category",
    "parse_extract",
    "parse_queries",
    "select_diverse",
]

DIVERSITY_RELEVANCE_WEIGHT = 0.3
_HISTORY_ITEMS = 12
_STRIP = " \t\r\n\"'`“”‘’「」『』。.,，:：;；!！?？*#()（）[]【】<>《》"


# --- H-1 classify -----------------------------------------------------------------------


def classify_messages(
    question: str,
    categories: Sequence[Category],
    *,
    background: str = "",
    last_result: str | None = None,
    history: Sequence[Message] = (),
) -> list[Message]:
    """SPEC H-1: the classify call: a system prompt with the categories and rules (and the
    previous result on the thread, if any), the history, then the question."""
    listing = json.dumps(
        [{"key": c.key, "description": c.description} for c in categories],
        ensure_ascii=False,
        indent=2,
    )
    parts = [
        "You are a classifier. Decide which one of the categories below the user's latest "
        "question belongs to."
    ]
    if background.strip():
        parts.append(f"## Background\n{background.strip()}")
    if last_result:
        parts.append(
            "## Previous result\nThe previous question on this conversation was classified "
            f"as: {last_result}"
        )
    parts.append(f"## Categories\n{listing}")
    parts.append(
        "## Rules\n"
        "- Choose exactly one category from the list.\n"
        "- If the question is unclear and the topic has not changed, keep the previous "
        "category.\n"
        "- If no category fits, choose the last one.\n"
        "- Reply with the key of the category only: no explanation, no quotes."
    )
    return [
        Message(role="system", content="\n\n".join(parts)),
        *history,
        Message(role="user", content=question),
    ]


def match_category(reply_text: str, categories: Sequence[Category]) -> str:
    """SPEC H-1: the category key a reply names: an exact key (case-insensitive, quotes and
    punctuation ignored; a JSON ``{"category": ...}`` reply is read too), else the longest key
    found in the reply, else the longest description found in it, else the LAST category."""
    if not categories:
        raise ValueError("no categories to match")
    text = (reply_text or "").strip()
    candidates = [text]
    named = _json_category(text)
    if named is not None:
        candidates.insert(0, named)
    for candidate in candidates:
        wanted = candidate.strip(_STRIP).casefold()
        for category in categories:
            if category.key.strip().casefold() == wanted:
                return category.key
    low = text.casefold()
    for attr in ("key", "description"):
        best: Category | None = None
        best_len = 0
        for category in categories:
            needle = getattr(category, attr).strip().casefold()
            if needle and needle in low and len(needle) > best_len:
                best, best_len = category, len(needle)
        if best is not None:
            return best.key
    return categories[-1].key


def classify_result(reply_text: str, categories: Sequence[Category]) -> dict[str, Any]:
    """SPEC H-1: ``{category, reason?}``; ``reason`` when a JSON reply gave one."""
    result: dict[str, Any] = {"category": match_category(reply_text, categories)}
    obj = _first_object(reply_text or "")
    reason = obj.get("reason") if obj else None
    if isinstance(reason, str) and reason.strip():
        result["reason"] = reason.strip()
    return result


def _json_category(text: str) -> str | None:
    obj = _first_object(text)
    if not obj:
        return None
    for key in ("category", "key", "id", "class"):
        value = obj.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _first_object(text: str) -> dict[str, Any] | None:
    block = find_balanced(text, "{")
    if block is None:
        return None
    try:
        value = loads_tolerant(block)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- H-2 extract ------------------------------------------------------------------------


def extract_schema(fields: Sequence[ExtractField]) -> dict[str, Any]:
    """SPEC H-2: the JSON schema of the object the model returns."""
    properties: dict[str, Any] = {}
    for f in fields:
        prop: dict[str, Any] = {"type": f.type}
        if f.description:
            prop["description"] = f.description
        if f.enum:
            prop["enum"] = list(f.enum)
        properties[f.name] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": [f.name for f in fields if f.required],
        "additionalProperties": False,
    }


def extract_response_format(fields: Sequence[ExtractField]) -> dict[str, Any]:
    """SPEC H-2: ``response_format`` for a profile that supports json_schema."""
    return {
        "type": "json_schema",
        "json_schema": {"name": "extracted_fields", "schema": extract_schema(fields)},
    }


def extract_messages(
    text: str,
    fields: Sequence[ExtractField],
    *,
    background: str = "",
    last_result: Mapping[str, Any] | None = None,
    history: Sequence[Message] = (),
) -> list[Message]:
    """SPEC H-2: the extract call: rules and the JSON schema in the system prompt (used
    whether or not ``response_format`` is sent too), the history, then the text."""
    required = [f.name for f in fields if f.required]
    parts = ["You extract structured data from text. Reply with one JSON object."]
    if background.strip():
        parts.append(f"## Background\n{background.strip()}")
    rules = [
        "- Output only the JSON object: no other text, no code fence.",
        "- Use only the keys in the schema.",
        "- Leave out a key whose value the text does not give; never invent a value.",
        "- Give each value the type the schema says; a key with an enum takes one of its values.",
    ]
    if required:
        rules.append(f"- Required keys: {', '.join(required)}.")
    parts.append("## Rules\n" + "\n".join(rules))
    if last_result:
        parts.append(
            "## Previous result\n" + json.dumps(dict(last_result), ensure_ascii=False, indent=2)
        )
    parts.append(
        "## JSON schema\n" + json.dumps(extract_schema(fields), ensure_ascii=False, indent=2)
    )
    return [
        Message(role="system", content="\n\n".join(parts)),
        *history,
        Message(role="user", content=f"Extract the fields from this text:\n\n{text}"),
    ]


def parse_extract(reply_text: str, fields: Sequence[ExtractField]) -> tuple[dict[str, Any], bool]:
    """SPEC H-2: ``(fields, success)`` from a reply. Never raises.

    The first balanced ``{...}`` is parsed tolerantly (json5); unparseable → ``{}``. Unknown
    keys, nulls and empty strings are dropped; simple type mismatches are coerced ("3" for an
    integer); missing required fields get their default (when one is set). ``success`` is
    true when every required field has a value.
    """
    try:
        raw = _first_object(reply_text or "") or {}
    except Exception:  # a bad model answer is never an error
        raw = {}
    by_name = {f.name: f for f in fields}
    found: dict[str, Any] = {}
    for key, value in raw.items():
        spec = by_name.get(key)
        if spec is None or value is None or (isinstance(value, str) and not value.strip()):
            continue
        found[key] = _coerce(value, spec.type)
    for f in fields:
        if f.required and f.name not in found and _has_value(f.default):
            found[f.name] = f.default
    ordered = {f.name: found[f.name] for f in fields if f.name in found}
    success = all(f.name in ordered for f in fields if f.required)
    return ordered, success


def _has_value(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def _coerce(value: Any, kind: str) -> Any:
    """Fix obvious type slips; anything else is returned unchanged."""
    if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if kind in ("number", "integer") and isinstance(value, str):
        try:
            number = float(value.strip().replace(",", ""))
        except ValueError:
            return value
        return int(number) if kind == "integer" and number.is_integer() else number
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "boolean" and isinstance(value, str):
        low = value.strip().casefold()
        if low in ("true", "yes", "1"):
            return True
        if low in ("false", "no", "0"):
            return False
    return value


# --- H-3 expand_query -------------------------------------------------------------------

_EXPAND_SYSTEM = """\
You rewrite a user's question into several search queries for a knowledge base, so that a \
search finds more of the relevant passages.

Rules:
1. Keep the meaning of the question; do not answer it.
2. Resolve references ("it", "that one", "the same") from the conversation history, and add \
the subject when the question leaves it implicit.
3. Vary the queries: synonyms, related terms, more specific and more general forms, \
different angles.
4. Each query is short, self-contained and suitable for a search engine.
5. Write in the language of the question; for names and technical terms you may add an \
English query too.
6. If the question is a greeting or needs no search, return an empty array.
7. Output only a JSON array of strings, nothing else.

Examples:
History: null
Question: How do I reset my password?
Output: ["reset password steps", "forgot password recovery", "change account password", \
"password reset email not received"]

History:
user: What is FastGPT?
assistant: FastGPT is a knowledge-base question answering platform.
Question: Is it free?
Output: ["Is FastGPT free", "FastGPT pricing", "FastGPT open source license", \
"FastGPT self-hosted cost"]

History: null
Question: 模组冲突怎么解决
Output: ["模组冲突 解决方法", "Minecraft 模组冲突 排查", "mod conflict fix", \
"游戏崩溃 模组不兼容"]"""


def expand_query_messages(
    question: str,
    *,
    count: int = 10,
    history: Sequence[Message] = (),
    background: str = "",
) -> list[Message]:
    """SPEC H-3: the expand_query call: rules and examples, then the background, the recent
    history (as ``role: text`` lines), the question and how many queries to write."""
    lines = [
        f"{m.role}: {m.text.strip()}"
        for m in history
        if m.role in ("user", "assistant") and m.text.strip()
    ][-_HISTORY_ITEMS:]
    user = (
        f"Background: {background.strip() or 'null'}\n\n"
        f"History:{chr(10) + chr(10).join(lines) if lines else ' null'}\n\n"
        f"Question: {question}\n\n"
        f"Write up to {count} queries."
    )
    return [Message(role="system", content=_EXPAND_SYSTEM), Message(role="user", content=user)]


def parse_queries(reply_text: str, original: str, count: int = 10, keep: int = 3) -> list[str]:
    """SPEC H-3: ``[original, *kept]``: the reply's JSON array (tolerant parse; failure →
    just the original), its first ``count`` strings, at most ``keep`` lexically diverse ones
    kept, de-duplicated (on letters and digits, case-insensitive)."""
    try:
        items = _parse_array(reply_text or "")
    except Exception:  # a bad model answer is never an error
        items = []
    seen = {_dedupe_key(original)}
    candidates: list[str] = []
    for item in items[: max(0, count)]:
        if isinstance(item, Mapping):
            item = item.get("query", item.get("q"))
        if not isinstance(item, str) or not item.strip():
            continue
        key = _dedupe_key(item)
        if key in seen:
            continue
        seen.add(key)
        candidates.append(item.strip())
    return [original, *select_diverse(original, candidates, keep)]


def select_diverse(query: str, candidates: Sequence[str], keep: int) -> list[str]:
    """Greedy max-min selection on character-bigram Jaccard similarity.

    Each pick maximizes ``0.3·sim(c, query) + (1 − max sim(c, chosen ∪ {query}))``: far from
    what is already covered, with a little weight on staying near the question. Ties keep
    the candidates' order. Deterministic.
    """
    chosen: list[str] = []
    grams = {c: _bigrams(c) for c in candidates}
    query_grams = _bigrams(query)
    remaining = list(candidates)
    while remaining and len(chosen) < keep:
        best = remaining[0]
        best_score = -1.0
        for cand in remaining:
            relevance = _jaccard(grams[cand], query_grams)
            closest = max([relevance, *(_jaccard(grams[cand], grams[c]) for c in chosen)])
            score = DIVERSITY_RELEVANCE_WEIGHT * relevance + (1.0 - closest)
            if score > best_score + 1e-12:
                best, best_score = cand, score
        chosen.append(best)
        remaining.remove(best)
    return chosen


def lexical_similarity(a: str, b: str) -> float:
    """Jaccard similarity of the character bigrams of two texts (0..1)."""
    return _jaccard(_bigrams(a), _bigrams(b))


def _bigrams(text: str) -> frozenset[str]:
    norm = " ".join(text.casefold().split())
    if len(norm) < 2:
        return frozenset([norm]) if norm else frozenset()
    return frozenset(norm[i : i + 2] for i in range(len(norm) - 1))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _dedupe_key(text: str) -> str:
    key = "".join(ch for ch in text.casefold() if ch.isalnum())
    return key or text.strip().casefold()


def _parse_array(text: str) -> list[Any]:
    start = text.find("[")
    end = text.rfind("]")
    if start < 0 or end <= start:
        return []
    try:
        value = loads_tolerant(text[start : end + 1], "[")
    except ValueError:
        try:
            value = loads_tolerant(text[start:], "[")
        except ValueError:
            return []
    return value if isinstance(value, list) else []
