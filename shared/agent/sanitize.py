"""A provider's reply made safe to store (pure): the model's server is untrusted input too.

A reply can carry a tool-call id repeated within it or from an earlier round (the store's key
is run + id), an id of any length, and NUL characters in ids, names, arguments, reasoning or
text (PostgreSQL text refuses NUL). Stored as they came, each fails the round's transaction,
and the round is retried — calling the model again — forever. ``sanitize_reply`` gives every
call an id unique within the run (given the ids it already used), at most ``MAX_ID_CHARS``
characters, free of control characters; it drops NUL from text and reasoning, and turns it
into U+FFFD in names and arguments (a name that was not a tool's stays unknown rather than
becoming one). Deterministic: the same reply and the same used ids give the same result, so a
retried round stores what the first attempt would have.

``poison_reason`` says whether a reply is one no sane provider sends (the caller ends the run
with that reason rather than calling the model again); ``sanitize_reply`` makes any reply,
poison or not, safe to store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import replace

from shared.agent.messages import Reply, ToolCall

__all__ = ["MAX_ID_CHARS", "MAX_NAME_CHARS", "poison_reason", "sanitize_reply", "unique_call_ids"]

MAX_ID_CHARS = 128
MAX_NAME_CHARS = 128  # the store's tool-name column; no tool's name is longer
_HASH_CHARS = 16
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _short(raw: str) -> str:
    """An id cut to the limit; a long one keeps a hash of the whole, so distinct stay distinct."""
    clean = _CONTROL.sub("", raw)
    if len(clean) <= MAX_ID_CHARS and clean == raw:
        return clean
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return f"{clean[: MAX_ID_CHARS - _HASH_CHARS - 1]}_{digest}"


def _free(base: str, taken: set[str]) -> str:
    candidate, n = base, 2
    while candidate in taken:
        suffix = f"_{n}"
        candidate = base[: MAX_ID_CHARS - len(suffix)] + suffix
        n += 1
    return candidate


def unique_call_ids(ids: Iterable[str], used: Iterable[str] = ()) -> list[str]:
    """``ids`` (in order) made storable and unique among themselves and ``used``. An empty
    id becomes ``call_<position>``."""
    taken = set(used)
    out = []
    for position, raw in enumerate(ids):
        new = _free(_short(raw) or f"call_{position}", taken)
        taken.add(new)
        out.append(new)
    return out


def poison_reason(reply: Reply, used_ids: Iterable[str] = ()) -> str | None:
    """Why the reply's tool calls cannot be trusted, or None: ids repeated (in the reply or
    from an earlier round), ids too long or with control characters, names with NUL or too
    long. No sane provider does these; a run given such a reply should end, not loop."""
    used, seen = set(used_ids), set()
    for call in reply.tool_calls:
        if len(call.id) > MAX_ID_CHARS or _CONTROL.search(call.id):
            return f"a tool call id is over {MAX_ID_CHARS} characters or has control characters"
        if call.id in seen:
            return f"the tool call id {call.id!r} is repeated in the reply"
        if call.id in used:
            return f"the tool call id {call.id!r} was already used in this run"
        if "\x00" in call.name or len(call.name) > MAX_NAME_CHARS:
            return "a tool name has a NUL character or is over 128 characters"
        seen.add(call.id)
    return None


def _nul_free(text: str, mark: str = "") -> str:
    return text.replace("\x00", mark) if "\x00" in text else text


def sanitize_reply(reply: Reply, used_ids: Iterable[str] = ()) -> Reply:
    """The reply with storable, run-unique call ids and no NUL anywhere (see the module doc).
    ``used_ids``: the ids of every tool call the run already stored."""
    ids = unique_call_ids((c.id for c in reply.tool_calls), used_ids)
    calls = tuple(
        ToolCall(
            id=new,
            name=_nul_free(c.name, "\ufffd")[:MAX_NAME_CHARS],
            arguments=_nul_free(c.arguments, "\ufffd"),
        )
        for c, new in zip(reply.tool_calls, ids, strict=True)
    )
    return replace(
        reply,
        text=_nul_free(reply.text),
        reasoning=_nul_free(reply.reasoning),
        tool_calls=calls,
        finish_reason=None if reply.finish_reason is None else _nul_free(reply.finish_reason),
        raw_model=None if reply.raw_model is None else _nul_free(reply.raw_model),
    )
