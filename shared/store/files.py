"""Attachments (SPEC M-11): a small storage interface, put and get by id.

The ``files`` row always holds the metadata; the bytes live in the row (``DatabaseFiles``,
embedded mode) or in a local directory (``DirectoryFiles``, production: ``TREADLE_FILES_DIR``).
A file belongs to a tenant: every lookup is by (id, tenant). Files are immutable.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, RowMapping

from shared.store.db import reading
from shared.store.tables import files

__all__ = [
    "DatabaseFiles",
    "DirectoryFiles",
    "FileMeta",
    "FileStore",
    "clean_name",
    "file_store",
    "new_file_id",
    "sniff_content_type",
]

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_MARKDOWN_EXT = (".md", ".markdown", ".mdown", ".mkd")
_MARKDOWN_HINTS = re.compile(
    r"^(#{1,6} \S|```|\s*[-*+] \[[ xX]\] |\|.*\|\s*$)|\[[^\]\n]+\]\([^)\s]+\)", re.MULTILINE
)
_SNIFF_BYTES = 65_536


def sniff_content_type(data: bytes, name: str = "") -> str:
    """By magic bytes (PDF, PNG, JPEG, GIF, WebP); else UTF-8 text is text/markdown (by
    extension or by content) or text/plain; anything else application/octet-stream."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    text = _utf8_head(data)
    if text is None:
        return "application/octet-stream"
    if name.lower().endswith(_MARKDOWN_EXT) or len(_MARKDOWN_HINTS.findall(text)) >= 2:
        return "text/markdown"
    return "text/plain"


def _utf8_head(data: bytes) -> str | None:
    """The first 64 KB as UTF-8 (a character cut at the end is fine); None for binary data."""
    head = data[:_SNIFF_BYTES]
    if b"\x00" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) > _SNIFF_BYTES and exc.start >= len(head) - 3:
            return head[: exc.start].decode("utf-8")
        return None


def clean_name(name: str | None, fallback: str = "file") -> str:
    """A safe file name: the last path component, no control characters, at most 255 chars."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if ch.isprintable()).strip().lstrip(".")
    return base[:255] or fallback


def new_file_id() -> str:
    return f"file_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class FileMeta:
    id: str
    tenant: str
    name: str
    size: int
    sha256: str
    content_type: str
    created_at: float

    def ref(self) -> dict[str, Any]:
        """What a run keeps of its attachment (``runs.inputs["attachments"]``)."""
        return {
            "id": self.id,
            "name": self.name,
            "content_type": self.content_type,
            "size": self.size,
            "sha256": self.sha256,
        }

    @classmethod
    def from_row(cls, row: RowMapping | Mapping[str, Any]) -> FileMeta:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            name=row["name"],
            size=int(row["size"]),
            sha256=row["sha256"],
            content_type=row["content_type"],
            created_at=float(row["created_at"]),
        )


_META_COLUMNS = (
    files.c.id,
    files.c.tenant,
    files.c.name,
    files.c.size,
    files.c.sha256,
    files.c.content_type,
    files.c.created_at,
)


class FileStore:
    """Put and get files by id, per tenant. Subclasses decide where the bytes go."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(
        self, tenant: str, name: str | None, data: bytes, content_type: str | None = None
    ) -> FileMeta:
        """Store ``data``; the content type is sniffed unless given."""
        safe = clean_name(name)
        meta = FileMeta(
            id=new_file_id(),
            tenant=tenant,
            name=safe,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            content_type=content_type or sniff_content_type(data, safe),
            created_at=time.time(),
        )
        where = self._write(meta, data)
        row = {
            "id": meta.id,
            "tenant": tenant,
            "name": meta.name,
            "size": meta.size,
            "sha256": meta.sha256,
            "content_type": meta.content_type,
            "created_at": meta.created_at,
            **where,
        }
        with self.engine.begin() as conn:
            conn.execute(sa.insert(files).values(**row))
        return meta

    def meta(self, file_id: str, tenant: str) -> FileMeta | None:
        return self.metas([file_id], tenant).get(file_id)

    def metas(self, ids: Iterable[str], tenant: str) -> dict[str, FileMeta]:
        """The files among ``ids`` that exist for ``tenant``, by id."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        with reading(self.engine) as conn:
            rows = conn.execute(
                sa.select(*_META_COLUMNS).where(files.c.id.in_(wanted), files.c.tenant == tenant)
            ).mappings()
            return {r["id"]: FileMeta.from_row(r) for r in rows}

    def get(self, file_id: str, tenant: str) -> tuple[FileMeta, bytes] | None:
        """The file's metadata and bytes; None when there is no such file for ``tenant``."""
        with reading(self.engine) as conn:
            row = (
                conn.execute(
                    sa.select(files).where(files.c.id == file_id, files.c.tenant == tenant)
                )
                .mappings()
                .first()
            )
        if row is None:
            return None
        return FileMeta.from_row(row), self._read(row)

    def delete(self, file_id: str, tenant: str) -> bool:
        """Delete the file (its row, then its bytes); False when ``tenant`` has no such file."""
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.delete(files)
                .where(files.c.id == file_id, files.c.tenant == tenant)
                .returning(files.c.location)
            ).first()
        if row is None:
            return False
        if row[0]:
            self._remove(str(row[0]))
        return True

    def _remove(self, location: str) -> None:
        """Bytes stored outside the row (a files directory)."""

    def _write(self, meta: FileMeta, data: bytes) -> dict[str, Any]:
        raise NotImplementedError

    def _read(self, row: RowMapping) -> bytes:
        if row["data"] is not None:
            return bytes(row["data"])
        raise FileNotFoundError(
            f"file {row['id']} is stored in a files directory "
            f"({row['location']}), and none is configured"
        )


class DatabaseFiles(FileStore):
    """Bytes in the ``files`` row (embedded mode: one SQLite file holds everything)."""

    def _write(self, meta: FileMeta, data: bytes) -> dict[str, Any]:
        return {"data": data}


class DirectoryFiles(FileStore):
    """Bytes under ``root/<tenant>/<xx>/<id>``, written atomically before the row exists."""

    def __init__(self, engine: Engine, root: str | os.PathLike[str]) -> None:
        super().__init__(engine)
        self.root = Path(root)

    def _write(self, meta: FileMeta, data: bytes) -> dict[str, Any]:
        rel = Path(_safe_part(meta.tenant)) / meta.id[-2:] / meta.id
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return {"location": rel.as_posix()}

    def _remove(self, location: str) -> None:
        path = Path(self.root, location).resolve()
        if path.is_relative_to(self.root.resolve()):
            path.unlink(missing_ok=True)

    def _read(self, row: RowMapping) -> bytes:
        if row["data"] is not None:
            return bytes(row["data"])
        path = Path(self.root, str(row["location"])).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise FileNotFoundError(f"file {row['id']}: location outside the files directory")
        return path.read_bytes()


def _safe_part(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value).lstrip(".") or "_"


def file_store(engine: Engine, files_dir: str = "") -> FileStore:
    """The configured store: a directory when ``files_dir`` is set, else the database."""
    if files_dir:
        return DirectoryFiles(engine, files_dir)
    return DatabaseFiles(engine)
