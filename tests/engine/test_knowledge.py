"""The knowledge base: documents in, passages out, on SQLite (FTS5) and PostgreSQL
(tsvector); the knowledge_search tools (with the LLM filter); chat quotes from a dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from shared.agent.spec import AgentSpec, ModelProfile
from shared.engine import commands, knowledge
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import NotFound, SpecError
from shared.llm.fake_server import FakeLLMServer
from shared.store import calls as call_store
from tests.embeddings_server import Embeddings
from tests.engine.helpers import agent, call, run, submit
from tests.files_support import tiny_pdf

HANDBOOK = """# Handbook

Welcome to Acme. This handbook explains how we work with customers.

## Refunds

Customers may ask for a refund within 30 days of delivery. Refunds go back to the original
payment method within five business days.

## Shipping

We ship to 40 countries. Express shipping takes two days; standard shipping takes a week.
"""
FAQ = """Frequently asked questions.

Can I change my password? Yes: open Settings, then Security, and choose a new password.

Do you offer gift cards? Gift cards are sold in amounts of 25, 50 and 100 euros.

退款政策：收到商品后三十天内可以申请退款。
"""


def _kb(rt: Runtime, name: str = "handbook") -> str:
    ds = knowledge.create_dataset(rt, "default", name, "Acme docs")
    knowledge.add_document(rt, "default", ds["id"], "handbook.md", HANDBOOK.encode())
    knowledge.add_document(rt, "default", ds["id"], "faq.txt", FAQ.encode())
    return str(ds["id"])


def test_search_finds_the_right_chunks_by_keyword(any_rt: Runtime) -> None:
    ds = _kb(any_rt)
    hits = knowledge.search(any_rt, "default", "How long does a refund take?", [ds], 3)
    assert hits[0]["document"] == "handbook.md" and "refund within 30 days" in hits[0]["text"]
    assert hits[0]["source"] == "handbook.md › Handbook"
    gift = knowledge.search(any_rt, "default", "gift cards", [ds], 3)
    assert gift[0]["document"] == "faq.txt" and "25, 50 and 100 euros" in gift[0]["text"]
    password = knowledge.search(any_rt, "default", "password", ["handbook"], 5)  # by name
    assert [h["document"] for h in password] == ["faq.txt"]
    assert knowledge.search(any_rt, "default", "zeppelin", [ds], 3) == []
    assert knowledge.search(any_rt, "default", "退款", [ds], 3)[0]["document"] == "faq.txt"


def test_stemming_and_exclusions(any_rt: Runtime) -> None:
    ds = _kb(any_rt)
    assert knowledge.search(any_rt, "default", "refunded", [ds], 1)[0]["document"] == "handbook.md"
    hits = knowledge.search(any_rt, "default", "shipping -express", [ds], 5)
    assert hits == []  # the only passage about shipping mentions express


def test_long_documents_are_chunked_with_overlap(any_rt: Runtime) -> None:
    ds = knowledge.create_dataset(any_rt, "default", "long", None)
    text = "\n\n".join(f"Section {i}. " + "Widgets are blue and sturdy. " * 12 for i in range(12))
    doc = knowledge.add_document(any_rt, "default", ds["id"], "widgets.txt", text.encode())
    assert doc["chunks"] >= 5 and doc["content_type"] == "text/plain"
    hits = knowledge.search(any_rt, "default", "section 7", [ds["id"]], 2)
    assert "Section 7." in hits[0]["text"]


def test_pdf_documents_are_searched_by_page(any_rt: Runtime) -> None:
    ds = knowledge.create_dataset(any_rt, "default", "pdfs", None)
    pdf = tiny_pdf([["Warranty lasts two years."], ["Batteries are covered for one year."]])
    doc = knowledge.add_document(any_rt, "default", ds["id"], "warranty.pdf", pdf)
    assert doc["content_type"] == "application/pdf" and doc["chunks"] == 2
    (hit,) = knowledge.search(any_rt, "default", "batteries", [ds["id"]], 3)
    assert hit["source"] == "warranty.pdf, p. 2"


def test_datasets_belong_to_their_tenant(any_rt: Runtime) -> None:
    ds = _kb(any_rt)
    with pytest.raises(NotFound):
        knowledge.search(any_rt, "other", "refund", [ds], 3)
    assert knowledge.search(any_rt, "other", "refund", [], 3) == []
    with pytest.raises(NotFound):
        knowledge.add_document(any_rt, "other", ds, "x.txt", b"hello")


def test_empty_documents_are_refused(sqlite_rt: Runtime) -> None:
    ds = knowledge.create_dataset(sqlite_rt, "default", "e", None)
    with pytest.raises(SpecError):
        knowledge.add_document(sqlite_rt, "default", ds["id"], "blank.txt", b"  \n ")


# --- tools -----------------------------------------------------------------------------------


def _tool_result(rt: Runtime, run_id: str) -> Any:
    with rt.engine.connect() as conn:
        (c,) = call_store.list_tool_calls(conn, run_id)
    return c


def test_an_inline_knowledge_tool(sqlite_rt: Runtime, stub: StubBroker) -> None:
    _kb(sqlite_rt)
    spec = agent(
        [{"tool_calls": [call("kb", {"query": "refund password"}, "k1")]}, {"text": "30."}],
        tools=[{"name": "kb", "knowledge": {"datasets": ["handbook"], "k": 2}}],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    c = _tool_result(sqlite_rt, run_id)
    assert c["read_only"] is True
    assert c["result"].startswith("[1] Source: handbook.md › Handbook\n")
    assert "refund within 30 days" in c["result"]
    assert len(c["data"]["passages"]) == 2
    assert run(sqlite_rt, run_id)["status"] == "completed"


def test_the_llm_filter_keeps_the_relevant_passages(sqlite_rt: Runtime, stub: StubBroker) -> None:
    _kb(sqlite_rt)
    pricing = {"tiers": [{"input": 1.0, "output": 1.0}]}
    sqlite_rt.profiles["picker"] = ModelProfile(
        name="picker", provider="scripted", replies=[{"text": "[2]"}], pricing=pricing
    )
    tool = {
        "name": "kb",
        "knowledge": {"datasets": ["handbook"], "k": 2, "filter": True, "filter_model": "picker"},
    }
    spec = agent(
        [{"tool_calls": [call("kb", {"query": "refund password"}, "k1")]}, {"text": "ok"}],
        tools=[tool],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    c = _tool_result(sqlite_rt, run_id)
    assert c["data"]["filtered"] is True
    assert [p["document"] for p in c["data"]["passages"]] == ["faq.txt"]  # the picked one
    assert c["data"]["candidates"] >= 2 and c["cost"] > 0
    assert c["result"].startswith("[1] Source:")


def test_the_registry_knowledge_search_tool(sqlite_rt: Runtime, stub: StubBroker) -> None:
    _kb(sqlite_rt)
    spec = agent(
        [
            {
                "tool_calls": [
                    call("knowledge_search", {"query": "gift cards", "dataset": "handbook"}, "k1")
                ]
            },
            {"text": "ok"},
        ],
        tools=["knowledge_search"],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    assert "25, 50 and 100 euros" in _tool_result(sqlite_rt, run_id)["result"]
    spec = agent(
        [
            {"tool_calls": [call("knowledge_search", {"query": "x", "dataset": "nope"}, "k1")]},
            {"text": "ok"},
        ],
        tools=["knowledge_search"],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    assert _tool_result(sqlite_rt, run_id)["result"] == "Tool error: dataset(s) not found: nope"


def test_unknown_datasets_are_refused_at_submit(sqlite_rt: Runtime) -> None:
    spec = agent([{"text": "x"}], tools=[{"name": "kb", "knowledge": {"datasets": ["nope"]}}])
    with pytest.raises(NotFound, match="nope"):
        submit(sqlite_rt, spec)
    chat = AgentSpec.model_validate({"kind": "chat", "dataset": "nope"})
    with pytest.raises(NotFound):
        submit(sqlite_rt, chat)


# --- chat quotes from a dataset (SPEC C-2) ------------------------------------------------------


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def _chat(llm: FakeLLMServer, **kw: Any) -> AgentSpec:
    model = {"provider": "openai", "base_url": llm.base_url, "model": "m"}
    return AgentSpec.model_validate({"kind": "chat", "model": model, **kw})


def _system_and_user(llm: FakeLLMServer) -> tuple[str, str]:
    (body,) = llm.bodies
    msgs = body["messages"]
    system = next((m["content"] for m in msgs if m["role"] == "system"), "")
    return system, msgs[-1]["content"]


def test_a_chat_agent_answers_with_quotes_from_its_dataset(
    any_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    _kb(any_rt)
    run_id = submit(
        any_rt, _chat(llm, dataset="handbook", dataset_k=2), "How many days do I have for a refund?"
    )
    stub.drain(any_rt)
    assert run(any_rt, run_id)["status"] == "completed"
    system, user = _system_and_user(llm)
    assert "Customers may ask for a refund within 30 days of delivery." in system
    assert "[1] Source: handbook.md › Handbook" in system
    assert user == "How many days do I have for a refund?"


def test_quotes_from_on_the_run_and_the_user_role(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    _kb(sqlite_rt)
    spec = _chat(llm, quote_role="user", quote_template="{{q}} (from {{source}})")
    row, _ = commands.submit_run(
        sqlite_rt,
        commands.RunInput(
            agent=spec,
            input="gift cards?",
            inputs={
                "quotes": [{"q": "Given quote."}],
                "quotes_from": {"dataset": "handbook", "k": 1},
            },
        ),
    )
    stub.drain(sqlite_rt)
    _, user = _system_and_user(llm)
    assert "Given quote." in user
    assert "Gift cards are sold in amounts of 25, 50 and 100 euros." in user
    assert "(from faq.txt)" in user and 'Question: """gift cards?"""' in user


def test_a_chat_agent_tool_with_a_dataset_quotes_it(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    _kb(sqlite_rt)
    expert = {
        "kind": "chat",
        "dataset": "handbook",
        "model": {"provider": "openai", "base_url": llm.base_url, "model": "m"},
    }
    spec = agent(
        [
            {"tool_calls": [call("expert", {"input": "express shipping time"}, "c1")]},
            {"text": "done"},
        ],
        tools=[{"name": "expert", "agent": expert}],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    system, _ = _system_and_user(llm)
    assert "Express shipping takes two days" in system and "Source: handbook.md" in system


# --- hybrid ranking with embeddings --------------------------------------------------------------


def test_hybrid_search_finds_passages_without_the_keywords(sqlite_rt: Runtime) -> None:
    emb = Embeddings()
    try:
        sqlite_rt.profiles["emb"] = ModelProfile(name="emb", base_url=emb.url, model="bow")
        sqlite_rt.settings.embeddings_profile = "emb"
        ds = _kb(sqlite_rt)
        with sqlite_rt.engine.connect() as conn:
            from shared.store.tables import datasets

            model = conn.execute(sa.select(datasets.c.embedding_model)).scalar()
        assert model == "bow"
        hits = knowledge.search(sqlite_rt, "default", "can I get my money back", [ds], 2)
        assert "refund within 30 days" in hits[0]["text"]  # no keyword in common
        assert emb.calls == 3  # two documents, one query
    finally:
        emb.server.shutdown()
