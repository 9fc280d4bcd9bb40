"""Attachments over HTTP: upload, inspect, sniffed types, limits, run references."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from shared.engine.attachments import store_for
from shared.engine.runtime import Runtime
from shared.store import runs as run_store
from shared.store.files import sniff_content_type
from shared.store.tables import files
from tests.files_support import tiny_pdf, tiny_png

CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "ok"}]}}


def upload(
    client: TestClient, name: str, data: bytes, declared: str = "application/x-any"
) -> dict[str, Any]:
    r = client.post("/v1/files", files={"file": (name, data, declared)})
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_upload_and_get(client: TestClient) -> None:
    data = b"Meeting notes\nShip on Friday.\n"
    made = upload(client, "notes.txt", data)
    assert made["id"].startswith("file_")
    assert made["name"] == "notes.txt"
    assert made["size"] == len(data)
    assert made["sha256"] == hashlib.sha256(data).hexdigest()
    assert made["content_type"] == "text/plain"
    assert made["created_at"].endswith("Z")
    got = client.get(f"/v1/files/{made['id']}")
    assert got.status_code == 200
    assert got.json() == made


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    [
        ("r.bin", tiny_pdf([["hello"]]), "application/pdf"),
        ("x.txt", tiny_png(), "image/png"),  # the bytes decide, not the name
        ("p.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 20, "image/jpeg"),
        ("g.gif", b"GIF89a\x01\x00\x01\x00" + b"\x00" * 20, "image/gif"),
        ("w.webp", b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 20, "image/webp"),
        ("readme.md", b"plain words", "text/markdown"),  # by extension
        (
            "doc",
            b"# Title\n\nSee [the site](https://example.com).\n",
            "text/markdown",
        ),  # by content
        ("doc.txt", "Grüße, 你好\n".encode(), "text/plain"),
        ("blob", b"\x00\x01\x02\xfe\xff", "application/octet-stream"),
    ],
)
def test_content_type_is_sniffed(client: TestClient, name: str, data: bytes, kind: str) -> None:
    assert upload(client, name, data, declared="text/html")["content_type"] == kind


def test_sniff_tolerates_a_character_cut_at_64k() -> None:
    text = ("é" * 40_000).encode()  # 80,000 bytes: the 64 KB head ends inside a character
    assert sniff_content_type(text) == "text/plain"


def test_name_form_field_and_path_stripped(client: TestClient) -> None:
    r = client.post("/v1/files", files={"file": ("../../etc/passwd", b"x")})
    assert r.json()["name"] == "passwd"
    r = client.post("/v1/files", files={"file": ("a.txt", b"x")}, data={"name": "better.txt"})
    assert r.json()["name"] == "better.txt"


def test_size_limit_is_a_setting(client: TestClient, sqlite_rt: Runtime) -> None:
    sqlite_rt.settings = sqlite_rt.settings.model_copy(update={"files_max_bytes": 1000})
    assert upload(client, "ok.txt", b"a" * 1000)["size"] == 1000
    r = client.post("/v1/files", files={"file": ("big.txt", b"a" * 1001)})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "too_large"
    big = client.post("/v1/files", files={"file": ("huge.txt", b"a" * 200_000)})
    assert big.status_code == 413  # refused by the Content-Length check before reading


def test_default_limit_allows_files_over_the_2mb_body_limit(client: TestClient) -> None:
    data = b"line of text\n" * 400_000  # 5.2 MB
    assert upload(client, "big.txt", data)["size"] == len(data)
    r = client.post("/v1/runs", json={"agent": CHAT, "input": "x" * 2_100_000})
    assert r.status_code == 413  # other routes keep the 2 MB body limit


def test_empty_and_unknown(client: TestClient) -> None:
    r = client.post("/v1/files", files={"file": ("e.txt", b"")})
    assert r.status_code == 422
    r = client.get("/v1/files/file_nope")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    assert client.post("/v1/files").status_code == 422  # no file part


def test_run_with_unknown_attachment_is_refused(client: TestClient) -> None:
    known = upload(client, "a.txt", b"hello")
    r = client.post(
        "/v1/runs",
        json={"agent": CHAT, "input": "hi", "attachments": [known["id"], "file_missing1"]},
    )
    assert r.status_code == 404
    assert "file_missing1" in r.json()["error"]["message"]
    assert known["id"] not in r.json()["error"]["message"]


def _inputs(rt: Runtime, run_id: str) -> dict[str, Any]:
    with rt.engine.connect() as conn:
        row = run_store.get_run(conn, run_id)
    assert row is not None
    return dict(row["inputs"])


def test_run_keeps_attachment_refs(client: TestClient, sqlite_rt: Runtime) -> None:
    a = upload(client, "a.txt", b"hello")
    b = upload(client, "r.pdf", tiny_pdf([["x"]]))
    r = client.post(
        "/v1/runs", json={"agent": CHAT, "input": "hi", "attachments": [b["id"], a["id"]]}
    )
    assert r.status_code == 201, r.text
    refs = _inputs(sqlite_rt, r.json()["id"])["attachments"]
    assert [(x["id"], x["name"], x["content_type"]) for x in refs] == [
        (b["id"], "r.pdf", "application/pdf"),
        (a["id"], "a.txt", "text/plain"),
    ]


def test_inline_data_url_becomes_a_file(client: TestClient, sqlite_rt: Runtime) -> None:
    png = tiny_png()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    named = "data:text/plain;name=notes%20v2.txt;base64," + base64.b64encode(b"hi").decode()
    r = client.post("/v1/runs", json={"agent": CHAT, "input": "hi", "attachments": [url, named]})
    assert r.status_code == 201, r.text
    refs = _inputs(sqlite_rt, r.json()["id"])["attachments"]
    assert [(x["name"], x["content_type"], x["size"]) for x in refs] == [
        ("attachment-1.png", "image/png", len(png)),
        ("notes v2.txt", "text/plain", 2),
    ]
    assert (
        client.get(f"/v1/files/{refs[0]['id']}").json()["sha256"] == hashlib.sha256(png).hexdigest()
    )


def test_bad_data_url_is_refused(client: TestClient) -> None:
    r = client.post(
        "/v1/runs",
        json={"agent": CHAT, "input": "hi", "attachments": ["data:image/png;base64,@@@"]},
    )
    assert r.status_code == 422
    assert "attachments" in r.json()["error"]["message"]


def test_directory_storage(client: TestClient, sqlite_rt: Runtime, tmp_path: Path) -> None:
    root = tmp_path / "files"
    sqlite_rt.settings = sqlite_rt.settings.model_copy(update={"files_dir": str(root)})
    made = upload(client, "notes.md", b"# Notes\n")
    stored = list(root.rglob(made["id"]))
    assert len(stored) == 1 and stored[0].read_bytes() == b"# Notes\n"
    with sqlite_rt.engine.connect() as conn:
        row = conn.execute(sa.select(files).where(files.c.id == made["id"])).mappings().one()
    assert row["data"] is None and row["location"]
    assert client.get(f"/v1/files/{made['id']}").json() == made
    found = store_for(sqlite_rt).get(made["id"], "default")
    assert found is not None and found[1] == b"# Notes\n"


def test_files_belong_to_a_tenant(client: TestClient, sqlite_rt: Runtime) -> None:
    made = upload(client, "a.txt", b"secret")
    store = store_for(sqlite_rt)
    assert store.meta(made["id"], "default") is not None
    assert store.meta(made["id"], "other") is None
    assert store.get(made["id"], "other") is None
