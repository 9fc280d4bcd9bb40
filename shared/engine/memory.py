"""Long-term memory (docs/memory.md): a tenant's items ``(namespace, key) → JSON value``,
shared by its runs across threads, read and written over the API, the LangGraph Store facade
and an agent's ``remember`` / ``recall`` tools.

* **Limits** (settings, checked before anything is written): the value's JSON size
  (``TooLarge``, 413), the key's length and the namespace's depth (``SpecError``, 422), the
  items a tenant may hold (``QuotaExceeded``, 409).
* **TTL**: an item may expire ``ttl_s`` after it was written; a read (get, search) starts its
  TTL again unless it says not to (``refresh_ttl``; default ``TREADLE_MEMORY_REFRESH_ON_READ``).
  Expired items are gone for reads at once; the reaper deletes their rows (``purge``).
* **Search**: under a namespace prefix, by a filter on the values, and by a query: keywords,
  fused by reciprocal rank with vector similarity when ``TREADLE_EMBEDDINGS_PROFILE`` names an
  embeddings profile (each item's text is embedded when it is written).
* **Runs** (``RunMemory``, a tool's ``ctx.memory``): the agent's namespace template filled
  from the run's metadata; each write and read is recorded on the run as a ``memory.written``
  / ``memory.read`` event, a write in the same transaction as the item.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from shared.agent import memory as pure
from shared.agent.knowledge import cosine, parse_query, reciprocal_rank_fusion
from shared.agent.spec import AgentSpec, MemorySpec
from shared.engine.change import Change
from shared.engine.knowledge import embeddings_profile
from shared.engine.runtime import Runtime
from shared.engine.transition import retrying
from shared.engine.tx import Tx
from shared.errors import ModelError, QuotaExceeded, SpecError, TooLarge, ToolError
from shared.llm.embeddings import embed
from shared.store import memory as store
from shared.store import runs as run_store
from shared.store.db import reading
from shared.store.memory import MemoryItem
from shared.store.rows import Run
from shared.vocab import EventType

__all__ = [
    "MAX_SCAN",
    "MAX_SCAN_BYTES",
    "MEMORY_TOOLS",
    "Hit",
    "RunMemory",
    "check_run_memory",
    "delete_item",
    "forget",
    "get_item",
    "list_namespaces",
    "purge",
    "put_item",
    "run_namespace",
    "search",
]

log = logging.getLogger("treadle.memory")
T = TypeVar("T")
MEMORY_TOOLS = frozenset({"remember", "recall"})
MAX_SCAN = 5_000  # items one search ranks, at most (the most recently written)
MAX_SCAN_BYTES = 16 * 1024 * 1024  # ... and no more than this of their values and texts
MAX_TTL_S = 10 * 366 * 86_400.0  # ten years, as a run's ttl_s
MAX_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: the item and its score (similarity, or the keyword score)."""

    item: MemoryItem
    score: float | None = None


def _checked(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _namespace(rt: Runtime, labels: Sequence[str], *, prefix: bool = False) -> tuple[str, ...]:
    depth = rt.settings.memory_max_namespace_depth
    return _checked(lambda: pure.check_namespace(labels, depth, prefix=prefix))


def _key(rt: Runtime, key: str) -> str:
    return _checked(lambda: pure.check_key(key, rt.settings.memory_max_key_chars))


@dataclass(frozen=True, slots=True)
class _Write:
    """A checked item, ready to be written in a transaction."""

    tenant: str
    namespace: tuple[str, ...]
    key: str
    values: dict[str, Any]


def _prepare(
    rt: Runtime,
    tenant: str,
    namespace: Sequence[str],
    key: str,
    value: Any,
    *,
    ttl_s: float | None,
    index: Sequence[str] | bool | None,
    run_id: str | None,
) -> _Write:
    """Every check (nothing written yet), then the text and its vector."""
    ns, key = _namespace(rt, namespace), _key(rt, key)
    if not isinstance(value, dict):
        raise SpecError("a memory item's value is a JSON object")
    size = len(json.dumps(value, ensure_ascii=False).encode())
    limit = rt.settings.memory_max_value_bytes
    if size > limit:
        raise TooLarge(
            f"the value is {size} bytes; at most {limit} (TREADLE_MEMORY_MAX_VALUE_BYTES)"
        )
    if ttl_s is not None and not 0 < ttl_s <= MAX_TTL_S:
        raise SpecError(f"ttl must be positive and at most {MAX_TTL_S:g} seconds")
    fields = None if index is None or isinstance(index, bool) else list(index)
    text = "" if index is False else pure.item_text(value, fields)
    vector, model = _embedded(rt, text)
    values = {
        "value": value,
        "text": text,
        "embedding": vector,
        "embedding_model": model,
        "ttl_s": ttl_s,
        "run_id": run_id,
    }
    return _Write(tenant, ns, key, values)


def _embedded(rt: Runtime, text: str) -> tuple[list[float] | None, str | None]:
    profile = embeddings_profile(rt) if text.strip() else None
    if profile is None:
        return None, None
    try:
        (vector,) = embed(profile, [text])
    except ModelError as exc:
        log.warning("embedding a memory item failed; keyword search only: %s", exc)
        return None, None
    return vector, profile.model or profile.name


def _write(conn: Connection, rt: Runtime, w: _Write, ts: float) -> MemoryItem:
    """The quota check and the write, in the caller's transaction."""
    most = rt.settings.memory_max_items
    new = most and not store.exists(conn, w.tenant, w.namespace, w.key, ts)
    if new and store.count_live(conn, w.tenant, ts) >= most:
        raise QuotaExceeded(
            f"the tenant holds {most} memory items, its limit (TREADLE_MEMORY_MAX_ITEMS); "
            "delete some first"
        )
    ttl = w.values["ttl_s"]
    values = {**w.values, "expires_at": ts + ttl if ttl is not None else None}
    return store.put_item(conn, w.tenant, w.namespace, w.key, values, ts)


def put_item(
    rt: Runtime,
    tenant: str,
    namespace: Sequence[str],
    key: str,
    value: Any,
    *,
    ttl_s: float | None = None,
    index: Sequence[str] | bool | None = None,
    run_id: str | None = None,
) -> MemoryItem:
    """Write (or replace) an item after every check; nothing is written when one fails."""
    w = _prepare(rt, tenant, namespace, key, value, ttl_s=ttl_s, index=index, run_id=run_id)
    with rt.engine.begin() as conn:
        return _write(conn, rt, w, run_store.now())


def _refreshing(rt: Runtime, refresh: bool | None) -> bool:
    return rt.settings.memory_refresh_on_read if refresh is None else refresh


def get_item(
    rt: Runtime,
    tenant: str,
    namespace: Sequence[str],
    key: str,
    *,
    refresh: bool | None = None,
) -> MemoryItem | None:
    ns, key = _namespace(rt, namespace), _key(rt, key)
    ts = run_store.now()
    with rt.engine.begin() as conn:
        item = store.get_item(conn, tenant, ns, key, ts)
        if item is not None and item.ttl_s is not None and _refreshing(rt, refresh):
            store.refresh(conn, [item], ts)
    return item


def delete_item(rt: Runtime, tenant: str, namespace: Sequence[str], key: str) -> bool:
    ns, key = _namespace(rt, namespace), _key(rt, key)
    with rt.engine.begin() as conn:
        return store.delete_item(conn, tenant, ns, key)


def forget(rt: Runtime, tenant: str, prefix: Sequence[str]) -> int:
    """Delete every item of the tenant under ``prefix`` (empty: all of its memory)."""
    ns = _namespace(rt, prefix, prefix=True)
    with rt.engine.begin() as conn:
        return store.delete_prefix(conn, tenant, ns)


def search(
    rt: Runtime,
    tenant: str,
    prefix: Sequence[str],
    *,
    query: str | None = None,
    flt: Mapping[str, Any] | None = None,
    limit: int = 10,
    offset: int = 0,
    refresh: bool | None = None,
) -> list[Hit]:
    """The items under ``prefix`` that match ``flt``: without a query the most recently
    written first; with one, those that match it best first."""
    ns = _namespace(rt, prefix, prefix=True)
    _checked(lambda: pure.check_filter(flt))
    limit, offset = max(1, min(limit, MAX_LIMIT)), max(0, offset)
    ts = run_store.now()
    with rt.engine.connect() as conn:
        found = store.scan(conn, tenant, ns, ts, MAX_SCAN, MAX_SCAN_BYTES)
    kept = [i for i in found if pure.matches_filter(i.value, flt)]
    hits = _ranked(rt, kept, query) if query and query.strip() else [Hit(i) for i in kept]
    page = hits[offset : offset + limit]
    touched = [h.item for h in page if h.item.ttl_s is not None]
    if touched and _refreshing(rt, refresh):
        with rt.engine.begin() as conn:
            store.refresh(conn, touched, ts)
    return page


def _ranked(rt: Runtime, items: list[MemoryItem], query: str) -> list[Hit]:
    """Keyword matches, fused with the vector ranking when there are vectors."""
    parsed = parse_query(query)
    keyword = {i: pure.keyword_score(parsed, item.text) for i, item in enumerate(items)}
    by_keyword = sorted((i for i, s in keyword.items() if s > 0), key=lambda i: -keyword[i])
    similar = _similarity(rt, items, query)
    if not similar:
        return [Hit(items[i], round(keyword[i], 6)) for i in by_keyword]
    by_vector = sorted(similar, key=lambda i: -similar[i])
    fused = reciprocal_rank_fusion([by_vector, by_keyword])
    return [Hit(items[i], round(similar.get(i, keyword[i]), 6)) for i, _ in fused]


def _similarity(rt: Runtime, items: list[MemoryItem], query: str) -> dict[int, float]:
    profile = embeddings_profile(rt) if any(i.embedding for i in items) else None
    if profile is None:
        return {}
    try:
        (qv,) = embed(profile, [query])
    except ModelError as exc:
        log.warning("embedding a memory query failed; keyword ranking only: %s", exc)
        return {}
    return {n: cosine(qv, i.embedding) for n, i in enumerate(items) if i.embedding}


def list_namespaces(
    rt: Runtime,
    tenant: str,
    *,
    prefix: Sequence[str] = (),
    suffix: Sequence[str] = (),
    max_depth: int | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[tuple[str, ...]]:
    """The namespaces holding live items, under ``prefix`` and ending with ``suffix``, cut
    to ``max_depth`` labels (then distinct), sorted."""
    ns = _namespace(rt, prefix, prefix=True)
    with reading(rt.engine) as conn:
        found = store.list_namespaces(conn, tenant, ns, run_store.now(), MAX_SCAN)
    tail = tuple(suffix)
    kept = [n for n in found if not tail or n[-len(tail) :] == tail]
    cut = sorted({n[:max_depth] if max_depth else n for n in kept})
    return cut[offset : offset + max(1, min(limit, MAX_LIMIT))]


def purge(rt: Runtime, *, now: float | None = None, batches: int = 20) -> int:
    """Delete expired items' rows (the reaper's retention pass); returns how many went."""
    ts = run_store.now() if now is None else now
    gone = 0
    for _ in range(batches):
        with rt.engine.begin() as conn:
            n = store.purge_expired(conn, ts)
        gone += n
        if n == 0:
            break
    return gone


# --- runs: the remember / recall tools -------------------------------------------------------


def _uses_memory(spec: AgentSpec) -> bool:
    return any(isinstance(t, str) and t in MEMORY_TOOLS for t in spec.tools)


def run_namespace(spec: AgentSpec, meta: Mapping[str, Any] | None, depth: int) -> tuple[str, ...]:
    """The run's memory namespace: its agent's template filled from the run's metadata."""
    template = (spec.memory or MemorySpec()).namespace
    return _checked(
        lambda: pure.check_namespace(pure.render_namespace(template, meta or {}), depth)
    )


def check_run_memory(rt: Runtime, spec: AgentSpec, meta: Mapping[str, Any] | None) -> None:
    """At submit: a run whose agent remembers or recalls has what its namespace needs (422
    now, not a tool error mid-run)."""
    if _uses_memory(spec):
        run_namespace(spec, meta, rt.settings.memory_max_namespace_depth)


class RunMemory:
    """A run's memory for its tools (``shared.tools.MemorySource``)."""

    def __init__(self, rt: Runtime, run: Run) -> None:
        self._rt, self._run = rt, run

    def _scope(self) -> tuple[tuple[str, ...], MemorySpec]:
        with reading(self._rt.engine) as conn:
            spec = self._rt.caches.spec_of(conn, self._run.id, loop=self._run.loop)
            meta = run_store.run_meta(conn, self._run.id)
        try:
            ns = run_namespace(spec, meta, self._rt.settings.memory_max_namespace_depth)
        except SpecError as exc:
            raise ToolError(str(exc)) from None
        return ns, spec.memory or MemorySpec()

    def remember(self, key: str | None, value: dict[str, Any]) -> dict[str, Any]:
        ns, mem = self._scope()
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
        key = key or "mem_" + hashlib.sha256(text.encode()).hexdigest()[:16]
        run = self._run
        try:
            w = _prepare(
                self._rt, run.tenant, ns, key, value, ttl_s=mem.ttl_s, index=None, run_id=run.id
            )
        except (SpecError, QuotaExceeded) as exc:
            raise ToolError(str(exc)) from None
        event = {"namespace": list(ns), "key": key, "preview": w.values["text"][:200]}

        def op(tx: Tx) -> None:
            _on_run(tx, run.id, EventType.MEMORY_WRITTEN, event)  # the run first: lock order
            _write(tx.conn, self._rt, w, tx.ts)

        try:
            retrying(self._rt, op)
        except QuotaExceeded as exc:
            raise ToolError(str(exc)) from None
        return {"namespace": list(ns), "key": key}

    def recall(self, query: str, k: int) -> list[dict[str, Any]]:
        ns, _ = self._scope()
        hits = search(self._rt, self._run.tenant, ns, query=query, limit=k)
        keys = [h.item.key for h in hits]
        event = {"namespace": list(ns), "query": query[:200], "keys": keys, "count": len(keys)}
        retrying(self._rt, lambda tx: _on_run(tx, self._run.id, EventType.MEMORY_READ, event))
        return [{"key": h.item.key, "value": h.item.value, "score": h.score} for h in hits]


def _on_run(tx: Tx, run_id: str, type_: EventType, data: dict[str, Any]) -> None:
    """The event on the run, through the transition path (no change of state); ToolError
    once the run has ended (a late write of a cancelled run is not made)."""
    run = run_store.load_run(tx.conn, run_id)
    if run is None or run.final:
        raise ToolError("the run has ended")
    change = Change(run, bump=False)
    change.event(type_.value, **data)
    tx.apply(change)
