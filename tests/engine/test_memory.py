"""Long-term memory (docs/memory.md) on SQLite and PostgreSQL: items by namespace and key,
search by prefix, filter and query (keywords; vectors with the test embeddings server), TTL
expiry with the clock moved (not slept), the limits, retention; and the ``remember`` /
``recall`` tools carrying a fact from one thread to another of the same user only."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from shared.agent.spec import AgentSpec, ModelProfile
from shared.engine import commands, memory, retention, threads
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import QuotaExceeded, SpecError, TooLarge
from shared.store import runs as run_store
from shared.store.tables import events, memory_items, tool_calls
from tests.embeddings_server import Embeddings
from tests.engine.helpers import call

NS = ["users", "u1", "facts"]


def _rows(rt: Runtime) -> int:
    with rt.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(memory_items)).scalar_one())


class Clock:
    """``run_store.now`` moved by hand: TTLs pass without sleeping."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.t = run_store.now()
        monkeypatch.setattr(run_store, "now", lambda: self.t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


def test_put_get_replace_delete(any_rt: Runtime) -> None:
    first = memory.put_item(any_rt, "default", NS, "colour", {"text": "green"})
    assert first.namespace == tuple(NS) and first.value == {"text": "green"}
    again = memory.put_item(any_rt, "default", NS, "colour", {"text": "blue"})
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    got = memory.get_item(any_rt, "default", NS, "colour")
    assert got is not None and got.value == {"text": "blue"}
    assert memory.get_item(any_rt, "other", NS, "colour") is None  # another tenant's
    assert memory.delete_item(any_rt, "default", NS, "colour")
    assert memory.get_item(any_rt, "default", NS, "colour") is None
    assert not memory.delete_item(any_rt, "default", NS, "colour")


def test_search_by_prefix_filter_and_keywords(any_rt: Runtime) -> None:
    put = memory.put_item
    put(any_rt, "default", ["users", "u1", "facts"], "a", {"text": "likes tea", "n": 1})
    put(any_rt, "default", ["users", "u1", "prefs"], "b", {"text": "dark mode", "n": 5})
    put(any_rt, "default", ["users", "u10"], "c", {"text": "likes coffee", "n": 9})
    put(any_rt, "default", ["users", "u_"], "d", {"text": "wildcards stay literal", "n": 2})
    put(any_rt, "other", ["users", "u1"], "e", {"text": "likes tea too", "n": 1})

    def keys(prefix: list[str], **kw: Any) -> list[str]:
        return sorted(h.item.key for h in memory.search(any_rt, "default", prefix, **kw))

    assert keys(["users", "u1"]) == ["a", "b"]  # not u10: a prefix is whole labels
    assert keys(["users", "u_"]) == ["d"]  # LIKE wildcards escaped
    assert keys(["users"]) == ["a", "b", "c", "d"]
    assert keys([], flt={"n": {"$gte": 5}}) == ["b", "c"]
    assert keys([], flt={"n": 1}) == ["a"]
    hits = memory.search(any_rt, "default", ["users"], query="who likes tea")
    assert [h.item.key for h in hits] == ["a", "c"]  # both "like"; only a has "tea"
    assert hits[0].score is not None and hits[0].score > (hits[1].score or 0)
    spaces = memory.list_namespaces(any_rt, "default", prefix=["users"])
    assert spaces == [
        ("users", "u1", "facts"),
        ("users", "u1", "prefs"),
        ("users", "u10"),
        ("users", "u_"),
    ]
    assert memory.list_namespaces(any_rt, "default", max_depth=2) == [
        ("users", "u1"),
        ("users", "u10"),
        ("users", "u_"),
    ]
    assert memory.list_namespaces(any_rt, "default", suffix=["prefs"]) == [("users", "u1", "prefs")]
    with pytest.raises(SpecError, match="operator"):
        memory.search(any_rt, "default", [], flt={"n": {"$regex": "x"}})


def test_semantic_search_ranks_the_right_item_first(sqlite_rt: Runtime) -> None:
    emb = Embeddings()
    try:
        sqlite_rt.profiles["emb"] = ModelProfile(name="emb", base_url=emb.url, model="bow")
        sqlite_rt.settings.embeddings_profile = "emb"
        put = memory.put_item
        put(sqlite_rt, "default", NS, "k1", {"text": "Orders ship from Rotterdam by parcel"})
        put(sqlite_rt, "default", NS, "k2", {"text": "A refund needs the receipt"})
        put(sqlite_rt, "default", NS, "k3", {"text": "Reset a password in Settings"})
        hits = memory.search(sqlite_rt, "default", NS, query="can I get my money back")
        assert hits[0].item.key == "k2"  # no keyword in common: the vectors found it
        assert emb.calls == 4  # three items, one query
    finally:
        emb.server.shutdown()


def test_ttl_expires_items_when_the_clock_moves(
    any_rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    memory.put_item(any_rt, "default", NS, "short", {"text": "soon gone"}, ttl_s=60)
    memory.put_item(any_rt, "default", NS, "kept", {"text": "stays"})
    clock.advance(50)
    assert memory.get_item(any_rt, "default", NS, "short") is not None  # read: TTL starts again
    clock.advance(50)  # 100 s after the write, 50 after the read
    assert memory.get_item(any_rt, "default", NS, "short", refresh=False) is not None
    clock.advance(20)  # 70 s after the last refreshing read
    assert memory.get_item(any_rt, "default", NS, "short") is None
    assert [h.item.key for h in memory.search(any_rt, "default", NS)] == ["kept"]
    assert _rows(any_rt) == 2  # gone for reads; the row waits for the reaper
    report = retention.purge(any_rt)
    assert report.memory_items == 1 and _rows(any_rt) == 1


def test_limits_refuse_and_write_nothing(any_rt: Runtime) -> None:
    s = any_rt.settings
    s.memory_max_value_bytes, s.memory_max_key_chars, s.memory_max_namespace_depth = 100, 10, 3
    s.memory_max_items = 2
    with pytest.raises(TooLarge):
        memory.put_item(any_rt, "default", NS, "k", {"text": "x" * 200})
    with pytest.raises(SpecError, match="key"):
        memory.put_item(any_rt, "default", NS, "k" * 11, {"text": "x"})
    with pytest.raises(SpecError, match="at most 3 labels"):
        memory.put_item(any_rt, "default", ["a", "b", "c", "d"], "k", {"text": "x"})
    with pytest.raises(SpecError, match="label"):
        memory.put_item(any_rt, "default", ["a.b"], "k", {"text": "x"})
    with pytest.raises(SpecError, match="JSON object"):
        memory.put_item(any_rt, "default", NS, "k", ["not", "an", "object"])
    assert _rows(any_rt) == 0
    memory.put_item(any_rt, "default", NS, "k1", {"text": "1"})
    memory.put_item(any_rt, "default", NS, "k2", {"text": "2"})
    memory.put_item(any_rt, "default", NS, "k2", {"text": "2 again"})  # a replace is no new item
    with pytest.raises(QuotaExceeded):
        memory.put_item(any_rt, "default", NS, "k3", {"text": "3"})
    memory.put_item(any_rt, "other", NS, "k3", {"text": "3"})  # another tenant has room
    assert _rows(any_rt) == 3


def test_forget_deletes_a_namespace_or_all_of_a_tenants_memory(any_rt: Runtime) -> None:
    for ns in (["a", "x"], ["a", "y"], ["b"]):
        memory.put_item(any_rt, "default", ns, "k", {"text": "v"})
    memory.put_item(any_rt, "other", ["a", "x"], "k", {"text": "v"})
    assert memory.forget(any_rt, "default", ["a"]) == 2
    assert memory.forget(any_rt, "default", []) == 1
    assert _rows(any_rt) == 1  # the other tenant's


# --- the remember / recall tools ---------------------------------------------------------------


def _memory_agent(*replies: dict[str, Any]) -> AgentSpec:
    return AgentSpec.model_validate(
        {
            "kind": "agent",
            "tools": ["remember", "recall"],
            "memory": {"namespace": ["users", "{user_id}"]},
            "model": {"provider": "scripted", "replies": list(replies)},
        }
    )


REMEMBER = _memory_agent(
    {"tool_calls": [call("remember", {"fact": "Ana's favourite colour is green"}, "c1")]},
    {"text": "Noted."},
)
RECALL = _memory_agent(
    {"tool_calls": [call("recall", {"query": "favourite colour"}, "c1")]},
    {"text": "Done."},
)


def _on_thread(rt: Runtime, stub: StubBroker, spec: AgentSpec, user: str) -> str:
    tid = commands.new_id("thr")
    threads.create_thread(rt, "default", {}, "enqueue", tid)
    row, _ = commands.submit_run(
        rt,
        commands.RunInput(agent=spec, input="hi", thread_id=tid, metadata={"user_id": user}),
    )
    stub.drain(rt)
    with rt.engine.connect() as conn:
        assert run_store.get_run(conn, row["id"])["status"] == "completed"
    return str(row["id"])


def _result(rt: Runtime, run_id: str) -> str:
    with rt.engine.connect() as conn:
        q = sa.select(tool_calls.c.result).where(tool_calls.c.run_id == run_id)
        return str(conn.execute(q).scalar_one())


def _events(rt: Runtime, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with rt.engine.connect() as conn:
        q = sa.select(events.c.type, events.c.data).where(
            events.c.run_id == run_id, events.c.type.like("memory.%")
        )
        return [(t, dict(d)) for t, d in conn.execute(q)]


def test_a_fact_crosses_threads_of_one_user_only(sqlite_rt: Runtime, stub: StubBroker) -> None:
    wrote = _on_thread(sqlite_rt, stub, REMEMBER, "ana")
    assert "Remembered" in _result(sqlite_rt, wrote)
    (written,) = _events(sqlite_rt, wrote)
    assert written[0] == "memory.written" and written[1]["namespace"] == ["users", "ana"]
    same_user = _on_thread(sqlite_rt, stub, RECALL, "ana")
    assert "favourite colour is green" in _result(sqlite_rt, same_user)
    (read,) = _events(sqlite_rt, same_user)
    assert read[0] == "memory.read" and read[1]["count"] == 1
    other_user = _on_thread(sqlite_rt, stub, RECALL, "bob")
    assert _result(sqlite_rt, other_user) == "Nothing remembered about that."
    item = memory.search(sqlite_rt, "default", ["users", "ana"])[0].item
    assert item.run_id == wrote


def test_a_run_without_the_namespace_metadata_is_refused(sqlite_rt: Runtime) -> None:
    with pytest.raises(SpecError, match="metadata.user_id"):
        commands.submit_run(sqlite_rt, commands.RunInput(agent=RECALL, input="hi"))
    bad = {"user_id": "a.b"}  # a label may not hold a dot
    with pytest.raises(SpecError, match="label"):
        commands.submit_run(sqlite_rt, commands.RunInput(agent=RECALL, input="hi", metadata=bad))


def test_a_search_reads_a_bounded_number_of_bytes(
    sqlite_rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(10):
        memory.put_item(sqlite_rt, "default", NS, f"k{i}", {"text": "x" * 1000})
    monkeypatch.setattr(memory, "MAX_SCAN_BYTES", 3_500)
    assert len(memory.search(sqlite_rt, "default", NS, limit=100)) == 2  # the newest first
