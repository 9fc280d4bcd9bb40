"""The knowledge base in the engine: datasets, documents in, passages out.

* ``add_document``: text, markdown or PDF (pypdf) → chunks of ~800 characters with ~150 of
  overlap (``shared.agent.knowledge``), each with its source; vectors too when
  ``TREADLE_EMBEDDINGS_PROFILE`` names an embeddings profile. One transaction. Parsing runs
  within the document limits (a PDF in a child process: ``shared.tools.documents``); a
  document cut short by them, or with more than ``TREADLE_DATASET_MAX_CHUNKS`` chunks, is
  refused whole rather than indexed in part.
* ``search``: keyword search (SQLite FTS5 / PostgreSQL full-text), fused with vector
  similarity by reciprocal rank when the dataset has vectors.
* ``Knowledge``: a tenant's search as a ``KnowledgeSource`` for tools (``knowledge_search``,
  a chat agent tool with ``dataset``).
* ``with_dataset_quotes``: a chat round's quotes taken from a dataset for the question
  (SPEC C-2, ``source`` filled).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import IntegrityError

from shared.agent.chat import DATASET_QUOTE_TEMPLATE, DEFAULT_QUOTE_TEMPLATE
from shared.agent.knowledge import (
    chunk_document,
    cosine,
    parse_query,
    passage_quotes,
    reciprocal_rank_fusion,
    search_text,
)
from shared.agent.messages import Message
from shared.agent.request import last_user_text
from shared.agent.spec import AgentSpec, InlineTool, ModelProfile
from shared.engine.gate import Stage
from shared.engine.runtime import Runtime
from shared.errors import ConfigError, Conflict, ModelError, NotFound, SpecError, ToolError
from shared.llm.embeddings import embed
from shared.llm.profiles import resolve_profile
from shared.store import datasets as store
from shared.store.db import reading
from shared.store.files import sniff_content_type
from shared.store.runs import now
from shared.tools.documents import DocumentLimits, extract

__all__ = [
    "MAX_K",
    "Knowledge",
    "add_document",
    "check_sources",
    "create_dataset",
    "dataset_detail",
    "embeddings_profile",
    "search",
    "with_dataset_quotes",
]

log = logging.getLogger("treadle.knowledge")
MAX_K = 50
CANDIDATES = 50  # keyword and vector candidates fused per search
MAX_VECTOR_SCAN = 20_000  # chunks compared by vector per search (brute force)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def embeddings_profile(rt: Runtime) -> ModelProfile | None:
    """The configured embeddings profile, or None (keyword search only)."""
    name = rt.settings.embeddings_profile
    if not name:
        return None
    return resolve_profile(name, rt.profiles)


# --- datasets and documents ---------------------------------------------------------------


def create_dataset(rt: Runtime, tenant: str, name: str, description: str | None) -> RowMapping:
    if not name.strip():
        raise SpecError("a dataset needs a name")
    row = {"id": _new_id("ds"), "tenant": tenant, "name": name.strip(), "description": description}
    try:
        with rt.engine.begin() as conn:
            return store.insert_dataset(conn, row, now())
    except IntegrityError:
        raise Conflict(f"a dataset named {name!r} already exists") from None


def dataset_detail(
    rt: Runtime, tenant: str, dataset_id: str
) -> tuple[RowMapping, list[RowMapping]]:
    with reading(rt.engine) as conn:
        ds = _dataset(conn, tenant, dataset_id)
        return ds, store.list_documents(conn, ds["id"])


def _dataset(conn: Connection, tenant: str, ref: str) -> RowMapping:
    found = store.find_datasets(conn, tenant, [ref])
    if not found:
        raise NotFound(f"dataset {ref} not found")
    return found[0]


def add_document(
    rt: Runtime,
    tenant: str,
    dataset_id: str,
    name: str,
    data: bytes,
    content_type: str | None = None,
    file_id: str | None = None,
) -> RowMapping:
    """Extract, chunk (and embed) a document, then store it with its chunks in one
    transaction. SpecError for an empty or unreadable document."""
    kind = content_type or sniff_content_type(data, name)
    limits = DocumentLimits.from_settings(rt.settings)
    try:
        found = extract(data, kind, name, limits, None, rt.confinement, tenant)
    except ToolError as exc:
        raise SpecError(str(exc)) from None
    if found.truncated:
        raise SpecError(
            f"{name} is over the document limits ({limits.max_pages} pages, "
            f"{limits.max_chars} characters: TREADLE_EXTRACT_MAX_PAGES, _MAX_CHARS)"
        )
    markdown = kind == "text/markdown" or name.endswith(".md")
    chunks = chunk_document(found.text, name, markdown=markdown)
    if not chunks:
        raise SpecError(f"{name} has no text to index")
    if len(chunks) > rt.settings.dataset_max_chunks:
        raise SpecError(
            f"{name} makes {len(chunks)} chunks; a document may have at most "
            f"{rt.settings.dataset_max_chunks} (TREADLE_DATASET_MAX_CHUNKS)"
        )
    rows = [
        {"idx": i, "text": c.text, "search_text": search_text(c.text), "source": c.source}
        for i, c in enumerate(chunks)
    ]
    model = _embed_rows(rt, rows)
    doc = {
        "id": _new_id("doc"),
        "dataset_id": dataset_id,
        "tenant": tenant,
        "name": name,
        "content_type": kind,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "file_id": file_id,
    }
    with rt.engine.begin() as conn:
        ds = _dataset(conn, tenant, dataset_id)
        doc["dataset_id"] = ds["id"]
        if model is not None and ds["embedding_model"] != model:
            store.set_embedding_model(conn, ds["id"], model)
        return store.insert_document(conn, doc, rows, now())


def _embed_rows(rt: Runtime, rows: list[dict[str, Any]]) -> str | None:
    """Vectors for the chunks when embeddings are configured; the model's name, or None (a
    failure is logged and the document is indexed for keyword search only)."""
    profile = embeddings_profile(rt)
    if profile is None:
        return None
    try:
        vectors = embed(profile, [r["text"] for r in rows])
    except ModelError as exc:
        log.warning("embedding a document failed; keyword search only: %s", exc)
        return None
    for row, vector in zip(rows, vectors, strict=True):
        row["embedding"] = vector
    return profile.model or profile.name


# --- search ------------------------------------------------------------------------------


def search(
    rt: Runtime, tenant: str, query: str, datasets: Sequence[str] | None = None, k: int = 5
) -> list[dict[str, Any]]:
    """The top ``k`` passages of the tenant's datasets (ids or names; None or empty = all)
    for ``query``: ``{chunk_id, dataset_id, document_id, document, index, text, source,
    score}``, best first. NotFound when a named dataset does not exist."""
    k = max(1, min(k, MAX_K))
    parsed = parse_query(query)
    with reading(rt.engine) as conn:
        found = store.find_datasets(conn, tenant, list(datasets or []))
        _check_found(found, datasets)
        ids = [d["id"] for d in found]
        keyword = store.fts_search(conn, ids, parsed, max(k, CANDIDATES))
        ranked = _fuse(rt, conn, found, query, keyword)[:k]
        chunks = store.chunks_by_id(conn, [i for i, _ in ranked])
    return [_hit(chunks[i], score) for i, score in ranked if i in chunks]


def _check_found(found: Sequence[RowMapping], refs: Sequence[str] | None) -> None:
    known = {d["id"] for d in found} | {d["name"] for d in found}
    missing = [r for r in refs or () if r not in known]
    if missing:
        raise NotFound(f"dataset(s) not found: {', '.join(missing)}")


def _fuse(
    rt: Runtime,
    conn: Connection,
    found: Sequence[RowMapping],
    query: str,
    keyword: list[tuple[int, float]],
) -> list[tuple[int, float]]:
    """Keyword ranking alone, or fused with the vector ranking by reciprocal rank."""
    vector = _vector_ranking(rt, conn, [d["id"] for d in found if d["embedding_model"]], query)
    if not vector:
        return keyword
    return reciprocal_rank_fusion([[i for i, _ in keyword], vector])


def _vector_ranking(rt: Runtime, conn: Connection, ids: list[str], query: str) -> list[int]:
    profile = embeddings_profile(rt) if ids else None
    if profile is None or not query.strip():
        return []
    try:
        (qv,) = embed(profile, [query])
    except ModelError as exc:
        log.warning("embedding a query failed; keyword ranking only: %s", exc)
        return []
    scored = [(cosine(qv, v), i) for i, v in store.embedded_chunks(conn, ids, MAX_VECTOR_SCAN)]
    scored.sort(key=lambda sv: (-sv[0], sv[1]))
    return [i for _, i in scored[:CANDIDATES]]


def _hit(chunk: Mapping[Any, Any], score: float) -> dict[str, Any]:
    return {
        "chunk_id": chunk["id"],
        "dataset_id": chunk["dataset_id"],
        "document_id": chunk["document_id"],
        "document": chunk["document"],
        "index": chunk["idx"],
        "text": chunk["text"],
        "source": chunk["source"],
        "score": round(score, 6),
    }


class Knowledge:
    """A tenant's datasets for tools (``shared.tools.KnowledgeSource``)."""

    def __init__(self, rt: Runtime, tenant: str) -> None:
        self._rt = rt
        self._tenant = tenant

    def search(self, query: str, datasets: Sequence[str], k: int) -> list[dict[str, Any]]:
        try:
            return search(self._rt, self._tenant, query, datasets, k)
        except NotFound as exc:
            raise ToolError(str(exc)) from None


# --- runs ----------------------------------------------------------------------------------


def check_sources(rt: Runtime, tenant: str, spec: AgentSpec, inputs: Mapping[str, Any]) -> None:
    """At submit: the datasets a run names (chat ``dataset``, ``quotes_from``, knowledge
    tools) exist for the tenant — a clear 404 now (like a missing thread or file the run
    names) rather than an empty search mid-run."""
    refs = _dataset_refs(spec, inputs)
    if not refs:
        return
    with reading(rt.engine) as conn:
        found = store.find_datasets(conn, tenant, refs)
    _check_found(found, refs)


def _dataset_refs(spec: AgentSpec, inputs: Mapping[str, Any]) -> list[str]:
    refs = [spec.dataset] if spec.dataset else []
    source = inputs.get("quotes_from") or {}
    if source.get("dataset"):
        refs.append(str(source["dataset"]))
    for tool in spec.tools:
        if isinstance(tool, InlineTool) and tool.knowledge is not None:
            refs += tool.knowledge.datasets
    return sorted(set(refs))


def with_dataset_quotes(
    rt: Runtime,
    run_id: str,
    tenant: str,
    spec: AgentSpec,
    history: Sequence[Message],
    inputs: dict[str, Any],
) -> tuple[AgentSpec, dict[str, Any]]:
    """A chat run with ``dataset`` (spec) or ``quotes_from`` (run): the passages for the
    question become quotes (after any given ones), rendered with their source (SPEC C-2).
    Returns the spec to build the request with, and the inputs."""
    source = _quote_source(spec, inputs)
    if source is None:
        return spec, inputs
    question = last_user_text(history)
    if not question.strip():
        return spec, inputs
    dataset, k = source
    try:
        with rt.gate.outside(Stage.CLAIM):  # an embedding call: I/O, not engine work
            hits = search(rt, tenant, question, [dataset], k)
    except (NotFound, ConfigError) as exc:
        log.warning("run %s: no quotes from dataset %s: %s", run_id, dataset, exc)
        return spec, inputs
    if not hits:
        return spec, inputs
    if spec.quote_template == DEFAULT_QUOTE_TEMPLATE:
        spec = spec.model_copy(update={"quote_template": DATASET_QUOTE_TEMPLATE})
    quotes = [*(inputs.get("quotes") or []), *passage_quotes(hits)]
    return spec, {**inputs, "quotes": quotes}


def _quote_source(spec: AgentSpec, inputs: Mapping[str, Any]) -> tuple[str, int] | None:
    if spec.kind != "chat":
        return None
    source = inputs.get("quotes_from") or {}
    if source.get("dataset"):
        return str(source["dataset"]), int(source.get("k") or spec.dataset_k)
    if spec.dataset:
        return spec.dataset, spec.dataset_k
    return None
