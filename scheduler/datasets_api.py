"""The knowledge base over HTTP (DESIGN §7, issue #10).

``POST /v1/datasets`` ``{name, description?}``; ``GET /v1/datasets``; ``GET /v1/datasets/{id}``
(with its documents); ``POST /v1/datasets/{id}/documents`` — JSON ``{name, text}`` (text or
markdown), JSON ``{file_id}`` (a file uploaded with ``POST /v1/files``: text, markdown or
PDF), or a multipart ``file`` (up to the 2 MB body limit); ``GET /v1/datasets/{id}/search?q=&k=``.
A dataset is the tenant's; ``{id}`` is its id or its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.engine import RowMapping
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from scheduler.auth import ReadCaller, WriteCaller
from scheduler.schemas import iso
from shared.engine import knowledge
from shared.engine.attachments import store_for
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.store import datasets as store

__all__ = ["DatasetCreate", "DocumentCreate", "datasets_router"]

DatasetRef = Annotated[str, Path(min_length=1, max_length=200,
                                 description="A dataset id (ds_...) or its name")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetCreate(_Strict):
    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=4000)


class DocumentCreate(_Strict):
    """A document as text (``name`` + ``text``) or as an uploaded file (``file_id``)."""

    name: str | None = Field(default=None, max_length=255)
    text: str | None = Field(default=None, max_length=1_900_000)
    content_type: str | None = Field(default=None, description="text/plain or text/markdown")
    file_id: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _one_source(self) -> DocumentCreate:
        if (self.text is None) == (self.file_id is None):
            raise ValueError("give `text` (with `name`) or `file_id`")
        if self.text is not None and not self.name:
            raise ValueError("a text document needs a `name`")
        return self


class DatasetView(BaseModel):
    id: str
    name: str
    description: str | None
    embedding_model: str | None
    created_at: str
    updated_at: str


class DocumentView(BaseModel):
    id: str
    dataset_id: str
    name: str
    content_type: str
    size: int
    chunks: int
    file_id: str | None
    created_at: str


class DatasetDetail(DatasetView):
    documents: list[DocumentView]


class DatasetList(BaseModel):
    datasets: list[DatasetView]


class Passage(BaseModel):
    chunk_id: int
    dataset_id: str
    document_id: str
    document: str
    index: int
    text: str
    source: str
    score: float


class SearchResult(BaseModel):
    query: str
    results: list[Passage]


def dataset_view(row: RowMapping) -> DatasetView:
    return DatasetView(id=row["id"], name=row["name"], description=row["description"],
                       embedding_model=row["embedding_model"],
                       created_at=iso(row["created_at"]), updated_at=iso(row["updated_at"]))


def document_view(row: RowMapping) -> DocumentView:
    return DocumentView(id=row["id"], dataset_id=row["dataset_id"], name=row["name"],
                        content_type=row["content_type"], size=row["size"], chunks=row["chunks"],
                        file_id=row["file_id"], created_at=iso(row["created_at"]))


_DOCUMENT_BODY: dict[str, Any] = {"requestBody": {"content": {
    "application/json": {"schema": DocumentCreate.model_json_schema()},
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary"},
                       "name": {"type": "string"}}}},
}}}


def _add_body(rt: Runtime, tenant: str, dataset: str, body: DocumentCreate) -> RowMapping:
    if body.file_id is not None:
        found = store_for(rt).get(body.file_id, tenant)
        if found is None:
            raise NotFound(f"file {body.file_id} not found")
        meta, data = found
        return knowledge.add_document(rt, tenant, dataset, body.name or meta.name, data,
                                      meta.content_type, file_id=meta.id)
    assert body.text is not None and body.name is not None
    kind = body.content_type or ("text/markdown" if body.name.endswith(".md") else "text/plain")
    return knowledge.add_document(rt, tenant, dataset, body.name, body.text.encode(), kind)


async def _multipart(rt: Runtime, tenant: str, dataset: str, request: Request) -> RowMapping:
    form = await request.form()
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise SpecError("multipart: a `file` part is required")
    data = await upload.read()
    if not data:
        raise SpecError("the file is empty")
    name = form.get("name")
    doc_name = name if isinstance(name, str) and name else upload.filename or "document"
    return await run_in_threadpool(knowledge.add_document, rt, tenant, dataset, doc_name, data)


def datasets_router(get_rt: Callable[[], Runtime]) -> APIRouter:
    r = APIRouter(prefix="/v1", tags=["datasets"])

    @r.post("/datasets", status_code=201, response_model=DatasetView)
    def create(body: DatasetCreate, caller: WriteCaller) -> DatasetView:
        """A dataset (knowledge base) of the tenant; names are unique per tenant."""
        return dataset_view(knowledge.create_dataset(get_rt(), caller.tenant, body.name,
                                                     body.description))

    @r.get("/datasets", response_model=DatasetList)
    def list_all(caller: ReadCaller) -> DatasetList:
        with get_rt().engine.connect() as conn:
            rows = store.list_datasets(conn, caller.tenant)
        return DatasetList(datasets=[dataset_view(d) for d in rows])

    @r.get("/datasets/{dataset}", response_model=DatasetDetail)
    def get(dataset: DatasetRef, caller: ReadCaller) -> DatasetDetail:
        ds, docs = knowledge.dataset_detail(get_rt(), caller.tenant, dataset)
        return DatasetDetail(**dataset_view(ds).model_dump(),
                             documents=[document_view(d) for d in docs])

    @r.post("/datasets/{dataset}/documents", status_code=201, response_model=DocumentView,
            openapi_extra=_DOCUMENT_BODY)
    async def add_document(dataset: DatasetRef, request: Request,
                           caller: WriteCaller) -> DocumentView:
        """Add a document: it is cut into overlapping chunks and indexed for search."""
        rt = get_rt()
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            return document_view(await _multipart(rt, caller.tenant, dataset, request))
        try:
            raw = await request.json()
        except ValueError:
            raise SpecError("the body must be JSON ({name, text} or {file_id}) or multipart "
                            "with a `file`") from None
        body = DocumentCreate.model_validate(raw)
        return document_view(await run_in_threadpool(_add_body, rt, caller.tenant, dataset,
                                                     body))

    @r.get("/datasets/{dataset}/search", response_model=SearchResult)
    def search(dataset: DatasetRef, caller: ReadCaller,
               q: Annotated[str, Query(min_length=1, max_length=2000)],
               k: Annotated[int, Query(ge=1, le=knowledge.MAX_K)] = 5) -> SearchResult:
        """Keyword search (hybrid with vectors when embeddings are configured): the best
        ``k`` passages with their sources."""
        hits = knowledge.search(get_rt(), caller.tenant, q, [dataset], k)
        return SearchResult(query=q, results=[Passage(**h) for h in hits])

    return r
