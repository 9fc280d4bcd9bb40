"""Per-process caches that make a round cheaper without holding run state (``RunCaches``,
one per runtime): every entry is checked against what the database says (messages are
append-only; a run's spec and inputs change only when a resume overrides the spec, which bumps
``runs.spec_rev``), so a miss, an eviction or another worker's progress only costs a read. A
spec is cached under its revision; what is derived from it (catalog, result budget) is cached
with the very spec object it was built from and rebuilt for any other, so no process can use a
spec a resume replaced. The caches are bounded by bytes (an estimate of what they hold), not by
entries: a worker's memory does not grow with the number of runs it has seen. A run that
pauses or ends leaves them (``forget``): a waiting run holds no memory in any worker, however
many wait.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Connection

from shared.agent.handoff import serving
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec
from shared.agent.tokens import estimate_tokens
from shared.engine.catalog import Catalog
from shared.store import lineage, records
from shared.store import runs as run_store
from shared.store.rows import Run
from shared.store.write import Prefetch
from shared.tools.files import TEXT_CACHE_SIZE, TextCache

__all__ = ["ByteLRU", "Given", "RunCaches", "schema_tokens_of"]

K = TypeVar("K")
V = TypeVar("V")

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

    def serving(self, loop: Mapping[str, Any] | None) -> AgentSpec:
        """The spec of the agent that serves the run in this loop state (docs/handoffs.md)."""
        return serving(self.spec, loop)


class RunCaches:
    """What this process holds of the runs it works on: their specs (``given``), model views
    (``history``), tool catalogs and result budgets (``shared.engine.toolkit`` builds them),
    the text of their files (``read_files``)."""

    def __init__(self) -> None:
        self.specs: ByteLRU[str, Given] = ByteLRU(SPECS_BYTES)
        self.views: ByteLRU[str, _View] = ByteLRU(HISTORY_BYTES)
        self.catalogs: ByteLRU[str, tuple[AgentSpec, Catalog, int]] = ByteLRU(CATALOG_BYTES)
        self.budgets: ByteLRU[str, tuple[AgentSpec, int]] = ByteLRU(1024 * 1024)
        self.texts = TextCache(TEXT_CACHE_SIZE)  # the files read_files read, as text

    def given(self, conn: Connection, run_id: str, rev: int | None = None) -> Given:
        """The run's spec and inputs at revision ``rev`` (read once per process and
        revision). ``rev`` None: the run's current revision, read from its row."""
        if rev is None:
            rev = run_store.spec_rev(conn, run_id)
        found = self.specs.get(run_id)
        if found is None or found.rev != rev:
            agent, inputs = run_store.run_spec(conn, run_id)
            found = self._put_given(run_id, agent, inputs, rev)
        return found

    def _put_given(
        self, run_id: str, agent: dict[str, Any], inputs: dict[str, Any] | None, rev: int
    ) -> Given:
        found = Given(AgentSpec.model_validate(agent), inputs, rev)
        size = len(json.dumps(agent)) * 4 + len(json.dumps(inputs or {})) + 512
        self.specs.put(run_id, found, size)
        return found

    def spec_of(
        self,
        conn: Connection,
        run_id: str,
        rev: int | None = None,
        *,
        loop: Mapping[str, Any] | None = None,
    ) -> AgentSpec:
        """The run's spec; given its ``loop`` state, the spec of the agent that serves it
        now (after its handoffs: docs/handoffs.md)."""
        return serving(self.given(conn, run_id, rev).spec, loop)

    def schema_tokens(self, run_id: str, built: Catalog) -> int:
        """What the tool schemas add to each request, in estimated tokens."""
        found = self.catalogs.get(run_id)
        return found[2] if found is not None and found[1] is built else schema_tokens_of(built)

    def history(
        self, conn: Connection, run_id: str, view_start: int, msg_seq: int, *, based: bool = True
    ) -> list[Message]:
        """The model view's messages (``seq >= view_start``), reading only rows this process
        has not seen: messages are append-only, so a cached prefix stays true. ``based``
        False: the run has no base run (its row says so), so its own rows are all of it."""
        read = records.list_messages if based else records.own_messages
        cached = self.views.get(run_id)
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
        self.views.put(run_id, view, view.size)
        return list(view.messages)

    def call_ids(self, run_id: str, view_start: int, msg_seq: int) -> frozenset[str] | None:
        """The ids of the tool calls in the run's cached view (seqs ``view_start``…
        ``msg_seq``), kept as the view grows so a round need not walk its history for them;
        None: not cached."""
        cached = self.views.get(run_id)
        if cached is None or cached.start != view_start or cached.seen != msg_seq:
            return None
        return cached.ids

    def remember(
        self, run_id: str, view_start: int, first_seq: int, msgs: Sequence[Message]
    ) -> None:
        """Messages this process just committed (seqs ``first_seq``…): extend the cached
        view when it ends right before them, so the next round here reads nothing."""
        cached = self.views.get(run_id)
        if cached is None or not msgs:
            return
        if view_start != cached.start or cached.seen != first_seq - 1:
            return
        view = _extend(cached, msgs, cached.seen + len(msgs))
        self.views.put(run_id, view, view.size)

    def cold(self, run_id: str) -> bool:
        """Whether this process holds neither the run's spec nor its history (a first round,
        a round after a pause, a takeover): its claim had better read them in the same trip."""
        return self.specs.get(run_id) is None and self.views.get(run_id) is None

    def prime(self, run: Run, pre: Prefetch) -> None:
        """Fill the caches from what a cold claim of ``run`` read (``Prefetch``); messages
        that do not reach the row's ``msg_seq`` (a commit raced the claim's snapshot) are
        left for ``history`` to read."""
        self._put_given(run.id, pre.agent, pre.inputs, run.spec_rev)
        rows = pre.messages
        if rows is None:
            return
        seen = int(rows[-1]["seq"]) if rows else run.view_start - 1
        if seen != run.msg_seq:  # messages are append-only: only the tail can be missing
            return
        msgs = [lineage.message_from_row(r) for r in rows]
        view = _extend(_empty(run.view_start), msgs, seen)
        self.views.put(run.id, view, view.size)

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drop what the caches hold of these runs (they paused or ended: a resume, hours
        later perhaps, reads them again)."""
        for run_id in run_ids:
            for lru in (self.specs, self.views, self.catalogs, self.budgets):
                lru.pop(run_id)


def schema_tokens_of(built: Catalog) -> int:
    return sum(
        estimate_tokens(json.dumps(e.parameters)) + estimate_tokens(e.description)
        for e in built.entries.values()
    )


def _size(msgs: Sequence[Message]) -> int:
    return sum(len(m.text) + 200 + sum(len(c.arguments) for c in m.tool_calls) for m in msgs)


def _empty(view_start: int) -> _View:
    return _View(view_start, view_start - 1, (), 0)


def _extend(view: _View, msgs: Sequence[Message], seen: int) -> _View:
    new = _call_ids(msgs)
    ids = view.ids | new if new else view.ids
    return _View(view.start, seen, view.messages + tuple(msgs), view.size + _size(msgs), ids)


def _call_ids(msgs: Iterable[Message]) -> frozenset[str]:
    return frozenset(c.id for m in msgs for c in m.tool_calls)
