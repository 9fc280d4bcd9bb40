"""The knowledge base over HTTP (docs/api.md).

``POST /v1/datasets`` ``{name, description?}``; ``GET /v1/datasets``; ``GET /v1/datasets/{id}``
(with its documents); ``POST /v1/datasets/{id}/documents`` — JSON ``{name, text}`` (text or
markdown), JSON ``{file_id}`` (a file uploaded with ``POST /v1/files``: text, markdown or
PDF), or a multipart ``file`` (up to the 2 MB body limit); ``GET /v1/datasets/{id}/search?q=&k=``.
A dataset is the tenant's; ``{id}`` is its id or its name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from sqlalchemy.engine import RowMapping
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.nul_free import NUL, NUL_FREE
from scheduler.http.openapi import REF_TEMPLATE, component
from scheduler.http.routing import api_router
from scheduler.http.schemas import ID_PATTERN, NOT_BLANK
from shared.engine import knowledge
from shared.engine.attachments import store_for
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.isotime import iso
from shared.store import datasets as store
from shared.store.db import reading
from shared.store.files import clean_name

__all__ = ["DatasetCreate", "DocumentCreate", "FileDocument", "TextDocument", "router"]

DatasetRef = Annotated[
    str, Path(min_length=1, max_length=200, description="A dataset id (ds_...) or its name")
]


MAX_NAME = 255  # a document's name
TEXT = f"^[^\\x00]*{NOT_BLANK[:-1]}\\x00][^\\x00]*$"  # not blank, no NUL (PostgreSQL text)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetCreate(_Strict):
    name: str = Field(min_length=1, max_length=200, pattern=NOT_BLANK)
    description: str | None = Field(default=None, max_length=4000)


class TextDocument(_Strict):
    """A document given as text (or markdown)."""

    name: str = Field(min_length=1, max_length=MAX_NAME)
    text: str = Field(min_length=1, max_length=1_900_000, pattern=TEXT)
    content_type: Literal["text/plain", "text/markdown"] | None = Field(
        default=None, description="Default: text/markdown for a name ending in .md"
    )


class FileDocument(_Strict):
    """A document from a file uploaded with ``POST /v1/files`` (text, markdown or PDF)."""

    file_id: str = Field(pattern=ID_PATTERN)
    name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)


DocumentCreate = TextDocument | FileDocument
"""Exactly one source: ``name`` + ``text``, or ``file_id`` (each form forbids the other's
fields)."""
_DOCUMENT_CREATE: TypeAdapter[DocumentCreate] = TypeAdapter(DocumentCreate)


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
    """The dataset's columns, its times in ISO 8601."""
    times = {"created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}
    return DatasetView.model_validate({**row, **times})


def document_view(row: RowMapping) -> DocumentView:
    """The document's columns, its time in ISO 8601."""
    return DocumentView.model_validate({**row, "created_at": iso(row["created_at"])})


_DOCUMENT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": component(
                    "DocumentCreate", _DOCUMENT_CREATE.json_schema(ref_template=REF_TEMPLATE)
                )
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "contentMediaType": "text/plain",
                            "minLength": 1,
                            "pattern": TEXT,
                            "description": "A part without a filename is text (or markdown); "
                            "an upload with one is sniffed: UTF-8 text, markdown or a PDF",
                        },
                        "name": {"type": "string", "maxLength": MAX_NAME, "pattern": NUL_FREE},
                    },
                }
            },
        },
    }
}


def _add_body(rt: Runtime, tenant: str, dataset: str, body: DocumentCreate) -> RowMapping:
    if isinstance(body, FileDocument):
        found = store_for(rt).get(body.file_id, tenant)
        if found is None:
            raise NotFound(f"file {body.file_id} not found")
        meta, data = found
        return knowledge.add_document(
            rt, tenant, dataset, body.name or meta.name, data, meta.content_type, file_id=meta.id
        )
    kind = body.content_type or ("text/markdown" if body.name.endswith(".md") else "text/plain")
    return knowledge.add_document(rt, tenant, dataset, body.name, body.text.encode(), kind)


async def _multipart(rt: Runtime, tenant: str, dataset: str, request: Request) -> RowMapping:
    """A ``file`` part: an upload (with a filename), or plain text (a part without one)."""
    form = await request.form()
    part, name = form.get("file"), form.get("name")
    if isinstance(part, UploadFile):
        # the upload's own file name, as /v1/files keeps it: no control characters (NUL)
        data, filename, kind = await part.read(), clean_name(part.filename, "document"), None
    elif isinstance(part, str):  # a plain form field: text, as the schema says
        if NUL in part or not part.strip():  # ``TEXT``, without a backtracking regex
            raise SpecError("file: text that is not blank, without NUL characters")
        data, filename, kind = part.encode(), None, "text/plain"
    else:
        raise SpecError("multipart: a `file` part is required")
    if not data:
        raise SpecError("the file is empty")
    if isinstance(name, str) and len(name) > MAX_NAME:
        raise SpecError(f"name: at most {MAX_NAME} characters")
    if isinstance(name, str) and NUL in name:  # the JSON form's rule (the body guard's)
        raise SpecError("name: without NUL characters")
    doc_name = name if isinstance(name, str) and name else filename or "document"
    return await run_in_threadpool(
        knowledge.add_document, rt, tenant, dataset, doc_name, data, kind
    )


router = api_router(prefix="/v1", tags=["datasets"])


@router.post("/datasets", status_code=201, response_model=DatasetView)
def create(body: DatasetCreate, rt: RuntimeDep, caller: WriteCaller) -> DatasetView:
    """A dataset (knowledge base) of the tenant; names are unique per tenant."""
    return dataset_view(knowledge.create_dataset(rt, caller.tenant, body.name, body.description))


@router.get("/datasets", response_model=DatasetList)
def list_all(rt: RuntimeDep, caller: ReadCaller) -> DatasetList:
    with reading(rt.engine) as conn:
        rows = store.list_datasets(conn, caller.tenant)
    return DatasetList(datasets=[dataset_view(d) for d in rows])


@router.get("/datasets/{dataset}", response_model=DatasetDetail)
def get(dataset: DatasetRef, rt: RuntimeDep, caller: ReadCaller) -> DatasetDetail:
    ds, docs = knowledge.dataset_detail(rt, caller.tenant, dataset)
    return DatasetDetail(
        **dataset_view(ds).model_dump(), documents=[document_view(d) for d in docs]
    )


@router.post(
    "/datasets/{dataset}/documents",
    status_code=201,
    response_model=DocumentView,
    openapi_extra=_DOCUMENT_BODY,
)
async def add_document(
    dataset: DatasetRef, request: Request, rt: RuntimeDep, caller: WriteCaller
) -> DocumentView:
    """Add a document: it is cut into overlapping chunks and indexed for search."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        return document_view(await _multipart(rt, caller.tenant, dataset, request))
    try:
        raw = await request.json()
    except ValueError:
        raise SpecError(
            "the body must be JSON ({name, text} or {file_id}) or multipart with a `file`"
        ) from None
    body = _DOCUMENT_CREATE.validate_python(raw)
    return document_view(await run_in_threadpool(_add_body, rt, caller.tenant, dataset, body))


@router.get("/datasets/{dataset}/search", response_model=SearchResult)
def search(
    dataset: DatasetRef,
    rt: RuntimeDep,
    caller: ReadCaller,
    q: Annotated[str, Query(min_length=1, max_length=2000)],
    k: Annotated[int, Query(ge=1, le=knowledge.MAX_K)] = 5,
) -> SearchResult:
    """Keyword search (hybrid with vectors when embeddings are configured): the best
    ``k`` passages with their sources."""
    hits = knowledge.search(rt, caller.tenant, q, [dataset], k)
    return SearchResult(query=q, results=[Passage(**h) for h in hits])
