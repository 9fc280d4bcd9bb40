"""Attachments over HTTP (SPEC M-11): ``POST /v1/files`` (multipart upload) and
``GET /v1/files/{id}``. Runs reference the returned ids in ``attachments``."""

from __future__ import annotations

from typing import Annotated

from fastapi import File, Form, HTTPException, UploadFile
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import PathId
from shared.engine.attachments import store_for
from shared.errors import NotFound, SpecError
from shared.isotime import iso
from shared.store.files import FileMeta

__all__ = ["FileView", "router", "upload_overhead"]

_CHUNK = 1 << 20
upload_overhead = 64 * 1024
"""Multipart framing allowed on top of the file size limit (the body-size middleware)."""


class FileView(BaseModel):
    id: str
    name: str
    size: int
    sha256: str
    content_type: str
    created_at: str


def file_view(meta: FileMeta) -> FileView:
    return FileView(
        id=meta.id,
        name=meta.name,
        size=meta.size,
        sha256=meta.sha256,
        content_type=meta.content_type,
        created_at=iso(meta.created_at),
    )


async def _read_capped(upload: UploadFile, limit: int) -> bytes:
    """The upload's bytes; 413 as soon as it is over ``limit``."""
    parts, size = [], 0
    while chunk := await upload.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"file over the {limit}-byte limit")
        parts.append(chunk)
    return b"".join(parts)


router = api_router(prefix="/v1", tags=["files"])


@router.post("/files", status_code=201, response_model=FileView)
async def upload(
    file: Annotated[
        UploadFile, File(description="The file (not empty)", json_schema_extra={"minLength": 1})
    ],
    rt: RuntimeDep,
    caller: WriteCaller,
    name: Annotated[str | None, Form(max_length=255)] = None,
) -> FileView:
    """Upload an attachment. The content type is sniffed from the bytes (PDF, PNG, JPEG,
    GIF, WebP; else UTF-8 text or markdown); the declared one is ignored."""
    data = await _read_capped(file, rt.settings.files_max_bytes)
    if not data:
        raise SpecError("the file is empty")
    meta = await run_in_threadpool(store_for(rt).put, caller.tenant, name or file.filename, data)
    return file_view(meta)


@router.get("/files/{file_id}", response_model=FileView)
def get_file(file_id: PathId, rt: RuntimeDep, caller: ReadCaller) -> FileView:
    meta = store_for(rt).meta(file_id, caller.tenant)
    if meta is None:
        raise NotFound(f"file {file_id} not found")
    return file_view(meta)
