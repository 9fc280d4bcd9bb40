"""Per-process caches that make a round cheaper without holding run state: every entry is
checked against what the database says (messages are append-only; a run's spec and inputs
change only when a resume overrides the spec, which bumps ``runs.spec_rev``), so a miss, an
eviction or another worker's progress only costs a read. A spec is cached under its revision;
what is derived from it (catalog, result budget) is cached with the very spec object it was
built from and rebuilt for any other, so no process can use a spec a resume replaced. The
caches are bounded by bytes (an estimate of what they hold), not by entries: a worker's
memory does not grow with the number of runs it has seen. A run that pauses or ends leaves
them (``forget``): a waiting run holds no memory in any worker, however many wait.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Connection

from shared.agent.compression import tool_result_budget
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec
from shared.agent.tokens import estimate_tokens
from shared.config import DEFAULT_TENANT
from shared.engine import metrics
from shared.engine.catalog import Catalog, build_catalog
from shared.engine.gate import Stage
from shared.engine.runtime import Runtime
from shared.errors import ConfigError
from shared.llm.profiles import resolve_profile
from shared.store import lineage, records
from shared.store import runs as run_store
from shared.store.rows import Run
from shared.store.write import Prefetch
from shared.tools.mcp_tools import McpAccess

__all__ = [
    "ByteLRU",
    "Given",
    "call_ids",
    "catalog",
    "cold",
    "forget",
    "given",
    "history",
    "mcp_access",
    "prime",
    "remember",
    "result_budget",
    "schema_tokens",
    "spec_of",
]

K = TypeVar("K")
V = TypeVar("V")
log = logging.getLogger("treadle.mcp")

SPECS_BYTES = 16 * 1024 * 1024
CATALOG_BYTES = 16 * 1024 * 1024
CATALOG_ENTRY_BYTES = 8 * 1024  # an estimate: a catalog holds tool objects and their schemas
HISTORY_BYTES = 64 * 1024 * 1024


class ByteLRU(Generic[K, V]):
    """An LRU map whose entries carry a size; the least recently used go first when the total
    passes ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._limit = limit
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            self._data.move_to_end(key)
            return item[0]

    def put(self, key: K, value: V, size: int) -> None:
        with self._lock:
            self._drop(key)
            if size > self._limit:
                return
            self._data[key] = (value, size)
            self._bytes += size
            while self._bytes > self._limit:
                _, (_, dropped) = self._data.popitem(last=False)
                self._bytes -= dropped

    def pop(self, key: K) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: K) -> None:  # the lock held
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True, slots=True)
class _View:
    """A run's cached model view: its messages from ``start`` to seq ``seen``."""

    start: int
    seen: int
    messages: tuple[Message, ...]
    size: int
    ids: frozenset[str] = frozenset()  # the ids of the tool calls its messages made


@dataclass(frozen=True, slots=True)
class Given:
    """What a run was given: its parsed spec (at revision ``rev``) and its inputs."""

    spec: AgentSpec
    inputs: dict[str, Any] | None
    rev: int = 0


_given: ByteLRU[str, Given] = ByteLRU(SPECS_BYTES)
_history: ByteLRU[str, _View] = ByteLRU(HISTORY_BYTES)


def given(conn: Connection, run_id: str, rev: int | None = None) -> Given:
    """The run's spec and inputs at revision ``rev`` (read once per process and revision).
    ``rev`` None: the run's current revision, read from its row."""
    if rev is None:
        rev = run_store.spec_rev(conn, run_id)
    found = _given.get(run_id)
    if found is None or found.rev != rev:
        agent, inputs = run_store.run_spec(conn, run_id)
        found = _put_given(run_id, agent, inputs, rev)
    return found


def _put_given(
    run_id: str, agent: dict[str, Any], inputs: dict[str, Any] | None, rev: int
) -> Given:
    found = Given(AgentSpec.model_validate(agent), inputs, rev)
    _given.put(run_id, found, len(json.dumps(agent)) * 4 + len(json.dumps(inputs or {})) + 512)
    return found


def spec_of(conn: Connection, run_id: str, rev: int | None = None) -> AgentSpec:
    return given(conn, run_id, rev).spec


_catalogs: ByteLRU[str, tuple[AgentSpec, Catalog, int]] = ByteLRU(CATALOG_BYTES)


def catalog(
    rt: Runtime,
    run_id: str,
    spec: AgentSpec,
    attachments: Sequence[Any],
    *,
    tenant: str = DEFAULT_TENANT,
    deadline: float | None = None,
) -> Catalog:
    """The run's tool catalog, built once per process for this very ``spec`` (``given``); a
    catalog missing an MCP server that could not be listed is built again next time (its
    listing waits at most until the run's ``deadline``, and counts against ``tenant``)."""
    found = _catalogs.get(run_id)
    if found is None or found[0] is not spec:
        mcp = replace(mcp_access(rt), tenant=tenant, deadline=deadline) if spec.mcp else None
        with rt.gate.outside(Stage.CLAIM) if mcp else nullcontext():  # MCP listing: I/O
            built = build_catalog(
                spec, rt.profiles, attachments=attachments, mcp=mcp, mcp_lists=rt.mcp_lists
            )
        tokens = _schema_tokens(built)
        found = (spec, built, tokens)
        if built.partial:
            if not built.deferred:  # a deferred round comes back: counted when it gives up
                _unavailable(run_id, built)
        else:  # its tools' schemas, as Python objects: about 4 bytes a character, 4 a token
            _catalogs.put(run_id, found, CATALOG_ENTRY_BYTES + 16 * tokens)
    return found[1]


def _unavailable(run_id: str, built: Catalog) -> None:
    """A log line and the metric for each MCP server a catalog lacks (the round that uses
    the catalog records a ``tool.unavailable`` event and tells the model)."""
    for server, why in built.unreachable.items():
        metrics.MCP_UNAVAILABLE.inc()
        log.warning("run %s: the tools of MCP server %r are unavailable: %s", run_id, server, why)


def mcp_access(rt: Runtime) -> McpAccess:
    """How this process reaches MCP servers (its settings)."""
    s = rt.settings
    hosts = tuple(h.strip() for h in s.allow_hosts.split(",") if h.strip())
    return McpAccess(
        allow_hosts=hosts,
        ttl=s.mcp_tools_ttl,
        max_bytes=s.mcp_max_bytes,
        timeout_s=s.mcp_timeout_s,
        max_tools=s.max_tools,
        list_bytes=s.mcp_list_max_bytes,
        wait_s=s.mcp_list_wait_s,
    )


_budgets: ByteLRU[str, tuple[AgentSpec, int]] = ByteLRU(1024 * 1024)


def result_budget(rt: Runtime, run_id: str, spec: AgentSpec) -> int:
    """The run's tool-result budget in tokens (L-7: from its profile's window)."""
    found = _budgets.get(run_id)
    if found is None or found[0] is not spec:
        try:
            window = resolve_profile(spec.model, rt.profiles).context_window
        except ConfigError:
            window = 128_000
        found = (spec, tool_result_budget(window, spec.tool_result_max_tokens))
        _budgets.put(run_id, found, 64)
    return found[1]


def schema_tokens(run_id: str, built: Catalog) -> int:
    """What the tool schemas add to each request, in estimated tokens."""
    found = _catalogs.get(run_id)
    return found[2] if found is not None and found[1] is built else _schema_tokens(built)


def _schema_tokens(built: Catalog) -> int:
    return sum(
        estimate_tokens(json.dumps(e.parameters)) + estimate_tokens(e.description)
        for e in built.entries.values()
    )


def _size(msgs: Sequence[Message]) -> int:
    return sum(len(m.text) + 200 + sum(len(c.arguments) for c in m.tool_calls) for m in msgs)


def history(
    conn: Connection, run_id: str, view_start: int, msg_seq: int, *, based: bool = True
) -> list[Message]:
    """The model view's messages (``seq >= view_start``), reading only rows this process has
    not seen: messages are append-only, so a cached prefix stays true. ``based`` False: the
    run has no base run (its row says so), so its own rows are all of it (no chain lookup)."""
    read = records.list_messages if based else records.own_messages
    cached = _history.get(run_id)
    if cached is not None and cached.start == view_start and cached.seen <= msg_seq:
        if cached.seen == msg_seq:
            return list(cached.messages)
        base = cached
        rows = read(conn, run_id, cached.seen + 1)
    else:
        base = _empty(view_start)
        rows = read(conn, run_id, view_start)
    new = tuple(lineage.message_from_row(r) for r in rows)
    view = _extend(base, new, rows[-1]["seq"] if rows else base.seen)
    _history.put(run_id, view, view.size)
    return list(view.messages)


def _empty(view_start: int) -> _View:
    return _View(view_start, view_start - 1, (), 0)


def _extend(view: _View, msgs: Sequence[Message], seen: int) -> _View:
    new = _call_ids(msgs)
    ids = view.ids | new if new else view.ids
    return _View(view.start, seen, view.messages + tuple(msgs), view.size + _size(msgs), ids)


def _call_ids(msgs: Iterable[Message]) -> frozenset[str]:
    return frozenset(c.id for m in msgs for c in m.tool_calls)


def call_ids(run_id: str, view_start: int, msg_seq: int) -> frozenset[str] | None:
    """The ids of the tool calls in the run's cached view (seqs ``view_start``…``msg_seq``),
    kept as the view grows so a round need not walk its history for them; None: not cached."""
    cached = _history.get(run_id)
    if cached is None or cached.start != view_start or cached.seen != msg_seq:
        return None
    return cached.ids


def remember(run_id: str, view_start: int, first_seq: int, msgs: Sequence[Message]) -> None:
    """Messages this process just committed (seqs ``first_seq``…): extend the cached view
    when it ends right before them, so the next round here reads nothing."""
    cached = _history.get(run_id)
    if cached is None or not msgs:
        return
    if view_start != cached.start or cached.seen != first_seq - 1:
        return
    view = _extend(cached, msgs, cached.seen + len(msgs))
    _history.put(run_id, view, view.size)


def cold(run_id: str) -> bool:
    """Whether this process holds neither the run's spec nor its history (a first round, a
    round after a pause, a takeover): its claim had better read them in the same trip."""
    return _given.get(run_id) is None and _history.get(run_id) is None


def prime(run: Run, pre: Prefetch) -> None:
    """Fill the caches from what a cold claim of ``run`` read (``Prefetch``); messages
    that do not reach the row's ``msg_seq`` (a commit raced the claim's snapshot) are left
    for ``history`` to read."""
    _put_given(run.id, pre.agent, pre.inputs, run.spec_rev)
    rows = pre.messages
    if rows is None:
        return
    seen = int(rows[-1]["seq"]) if rows else run.view_start - 1
    if seen != run.msg_seq:  # messages are append-only: only the tail can be missing
        return
    view = _extend(_empty(run.view_start), [lineage.message_from_row(r) for r in rows], seen)
    _history.put(run.id, view, view.size)


def forget(run_ids: Iterable[str]) -> None:
    """Drop what the caches hold of these runs (they paused or ended: a resume, hours later
    perhaps, reads them again)."""
    for run_id in run_ids:
        for lru in (_given, _history, _catalogs, _budgets):
            lru.pop(run_id)
