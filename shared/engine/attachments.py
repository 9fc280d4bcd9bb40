"""A run's attachments in the engine (SPEC M-11): resolved at submit, loaded for the model
(vision) and for tools (``read_files``, ``run_python``).

A run keeps refs ``{id, name, content_type, size, sha256}`` in ``runs.inputs["attachments"]``,
never bytes: the bytes stay in the file store and are read when a round or a tool needs them.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.agent.attachments import attachment_refs, image_refs
from shared.agent.spec import ModelProfile
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.store.files import FileStore, file_store, sniff_content_type

__all__ = [
    "INLINE_MAX_BYTES",
    "MAX_ATTACHMENTS",
    "InlineFile",
    "RunFiles",
    "parse_data_url",
    "request_inputs",
    "resolve_attachments",
    "run_files",
    "store_for",
]

MAX_ATTACHMENTS = 20
INLINE_MAX_BYTES = 1_500_000  # decoded; the request body itself is capped at 2 MB
log = logging.getLogger("treadle.attachments")
_DATA_URL = re.compile(r"^data:(?P<meta>[^,]*?)(?P<b64>;base64)?,(?P<data>.*)$", re.DOTALL)
DATA_URL_B64 = (
    r"^data:[^,]*;base64,(?:[A-Za-z0-9+/]{4})*"
    r"(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)$"
)
"""An inline attachment: a base64 ``data:`` URL with at least one byte (the API's schema)."""
_DATA_URL_B64 = re.compile(DATA_URL_B64)
_EXT = {
    "application/pdf": "pdf",
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "text/markdown": "md",
    "text/plain": "txt",
}


def store_for(rt: Runtime) -> FileStore:
    """The configured file store (``TREADLE_FILES_DIR``, or the database)."""
    return file_store(rt.engine, rt.settings.files_dir)


@dataclass(frozen=True)
class InlineFile:
    name: str | None
    content_type: str | None
    data: bytes


def parse_data_url(url: str, max_bytes: int = INLINE_MAX_BYTES) -> InlineFile:
    """``data:[<type>][;name=<name>][;base64],<data>`` → its bytes; SpecError when invalid."""
    m = _DATA_URL.match(url)
    if m is None:
        raise SpecError("an inline attachment must be a data: URL")
    kind, *params = (m["meta"] or "").split(";")
    fields = dict(p.split("=", 1) for p in params if "=" in p)
    raw = m["data"]
    try:
        data = (
            base64.b64decode(raw, validate=True) if m["b64"] else urllib.parse.unquote_to_bytes(raw)
        )
    except (binascii.Error, ValueError) as exc:
        raise SpecError(f"an inline attachment is not valid base64: {exc}") from None
    if len(data) > max_bytes:
        raise SpecError(
            f"an inline attachment is over {max_bytes} bytes; upload it with "
            "POST /v1/files and pass its id"
        )
    name = urllib.parse.unquote(fields["name"]) if "name" in fields else None
    return InlineFile(name=name, content_type=kind.strip().lower() or None, data=data)


def resolve_attachments(rt: Runtime, tenant: str, items: Sequence[Any]) -> list[dict[str, Any]]:
    """Submit: file ids must exist for the tenant (SpecError names the missing ones); inline
    data URLs are stored as files. Returns the run's attachment refs, in the given order.
    An item may also be a ref (a re-submitted run's): its id is checked like any other."""
    if len(items) > MAX_ATTACHMENTS:
        raise SpecError(f"at most {MAX_ATTACHMENTS} attachments per run")
    flat = [str(i.get("id", "")) if isinstance(i, Mapping) else i for i in items]
    if not all(isinstance(i, str) for i in flat):
        raise SpecError("attachments: each item is a file id or a data: URL")
    store = store_for(rt)
    ids = [i for i in flat if not i.startswith("data:")]
    known = store.metas(ids, tenant)
    missing = [i for i in ids if i not in known]
    if missing:  # a 404, like any other missing thing a run names
        raise NotFound(
            f"attachments: unknown file id(s) {', '.join(missing)}; "
            "upload files with POST /v1/files first"
        )
    return [
        known[i].ref() if i in known else _store_inline(store, tenant, i, n)
        for n, i in enumerate(flat, 1)
    ]


def _store_inline(store: FileStore, tenant: str, url: str, n: int) -> dict[str, Any]:
    if not _DATA_URL_B64.fullmatch(url):
        raise SpecError("an inline attachment must be a base64 data: URL with data")
    inline = parse_data_url(url)
    kind = sniff_content_type(inline.data, inline.name or "")
    name = inline.name or f"attachment-{n}.{_EXT.get(kind, 'bin')}"
    return store.put(tenant, name, inline.data, kind).ref()


def _data_url(content_type: str, data: bytes) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode('ascii')}"


def request_inputs(
    rt: Runtime, tenant: str, given: Mapping[str, Any] | None, profile: ModelProfile
) -> dict[str, Any]:
    """The run's inputs for ``plan_request``; a vision profile also gets ``images``: the
    image attachments as data URLs (loaded here: ``shared.agent`` does no I/O)."""
    inputs = dict(given or {})
    images = image_refs(attachment_refs(inputs)) if profile.vision else []
    if images:
        files = run_files(rt, tenant, inputs)
        inputs["images"] = [url for r in images if (url := _image_url(files, r))]
    return inputs


def _image_url(files: RunFiles, ref: Mapping[str, Any]) -> str | None:
    try:
        return _data_url(str(ref["content_type"]), files.read(str(ref["id"])))
    except OSError:  # gone from the store: the round goes on without it
        log.warning("attachment %s could not be read", ref["id"], exc_info=True)
        return None


class RunFiles:
    """Reads a run's attachments (``shared.tools.FileSource``): only the run's own files,
    only within its tenant."""

    def __init__(self, store: FileStore, tenant: str, refs: Sequence[Mapping[str, Any]]) -> None:
        self._store = store
        self._tenant = tenant
        self._ids = frozenset(str(r["id"]) for r in refs)

    def read(self, file_id: str) -> bytes:
        if file_id not in self._ids:
            raise FileNotFoundError(f"{file_id} is not attached to this run")
        found = self._store.get(file_id, self._tenant)
        if found is None:
            raise FileNotFoundError(f"file {file_id} no longer exists")
        return found[1]


def run_files(rt: Runtime, tenant: str, inputs: Mapping[str, Any] | None) -> RunFiles:
    return RunFiles(store_for(rt), tenant, attachment_refs(inputs))
