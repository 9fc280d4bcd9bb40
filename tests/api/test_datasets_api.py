"""The knowledge base over HTTP."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from tests.files_support import tiny_pdf

GUIDE = "# Guide\n\nThe blue button restarts the machine. Hold it for three seconds."
NOTES = "Cleaning: wipe the filter every week with warm water."


def _dataset(client: TestClient, name: str = "manuals") -> dict[str, Any]:
    r = client.post("/v1/datasets", json={"name": name, "description": "Machine manuals"})
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_create_upload_and_search(client: TestClient) -> None:
    ds = _dataset(client)
    assert ds["id"].startswith("ds_") and ds["name"] == "manuals"
    assert client.post("/v1/datasets", json={"name": "manuals"}).status_code == 409
    r = client.post(f"/v1/datasets/{ds['id']}/documents", json={"name": "guide.md", "text": GUIDE})
    assert r.status_code == 201, r.text
    doc = r.json()
    assert (doc["content_type"], doc["chunks"]) == ("text/markdown", 1)
    r = client.post(
        "/v1/datasets/manuals/documents",  # by name, multipart
        files={"file": ("notes.txt", NOTES.encode(), "text/plain")},
    )
    assert r.status_code == 201, r.text
    found = client.get(f"/v1/datasets/{ds['id']}/search", params={"q": "restart button"}).json()
    assert found["query"] == "restart button"
    (hit,) = found["results"]
    assert hit["document"] == "guide.md" and hit["source"] == "guide.md › Guide"
    assert "three seconds" in hit["text"]
    weekly = client.get("/v1/datasets/manuals/search", params={"q": "filter", "k": 1}).json()
    assert [h["document"] for h in weekly["results"]] == ["notes.txt"]
    detail = client.get("/v1/datasets/manuals").json()
    assert [d["name"] for d in detail["documents"]] == ["guide.md", "notes.txt"]
    assert [d["name"] for d in client.get("/v1/datasets").json()["datasets"]] == ["manuals"]


def test_a_pdf_from_the_files_api(client: TestClient) -> None:
    ds = _dataset(client)
    pdf = tiny_pdf([["Safety first."], ["Unplug the machine before cleaning."]])
    file_id = client.post("/v1/files", files={"file": ("manual.pdf", pdf)}).json()["id"]
    r = client.post(f"/v1/datasets/{ds['id']}/documents", json={"file_id": file_id})
    assert r.status_code == 201, r.text
    assert r.json()["file_id"] == file_id and r.json()["chunks"] == 2
    hits = client.get(f"/v1/datasets/{ds['id']}/search", params={"q": "unplug"}).json()
    assert hits["results"][0]["source"] == "manual.pdf, p. 2"


def test_errors(client: TestClient) -> None:
    assert client.get("/v1/datasets/nope").status_code == 404
    assert client.get("/v1/datasets/nope/search", params={"q": "x"}).status_code == 404
    ds = _dataset(client)
    url = f"/v1/datasets/{ds['id']}/documents"
    assert client.post(url, json={"text": "no name"}).status_code == 422
    assert client.post(url, json={"name": "a", "text": "b", "file_id": "f"}).status_code == 422
    assert client.post(url, json={"file_id": "file_missing"}).status_code == 404
    assert (
        client.post(
            url, content=b"not json", headers={"content-type": "application/json"}
        ).status_code
        == 422
    )
    assert client.post(url, json={"name": "empty.txt", "text": "   "}).status_code == 422
    assert client.get(f"/v1/datasets/{ds['id']}/search").status_code == 422  # q is required


def test_a_chat_run_with_a_dataset_and_an_unknown_one(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    _dataset(client)
    client.post("/v1/datasets/manuals/documents", json={"name": "guide.md", "text": GUIDE})
    r = client.post(
        "/v1/runs",
        json={
            "agent": {"kind": "chat", "model": "demo", "dataset": "manuals"},
            "input": "restart?",
        },
    )
    assert r.status_code == 201, r.text
    stub.drain(sqlite_rt)
    assert client.get(f"/v1/runs/{r.json()['id']}").json()["status"] == "completed"
    r = client.post(
        "/v1/runs", json={"agent": {"kind": "chat", "dataset": "missing"}, "input": "x"}
    )
    assert r.status_code == 404 and "missing" in r.json()["error"]["message"]


def test_quotes_from_a_dataset_on_the_run_body(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC C-2 with quotes taken from a dataset search: the request carries the
    # passage and its source
    from shared.llm.fake_server import FakeLLMServer, ReplySpec

    _dataset(client)
    client.post("/v1/datasets/manuals/documents", json={"name": "guide.md", "text": GUIDE})
    with FakeLLMServer() as llm:
        llm.script(ReplySpec(text="Hold the blue button for three seconds (guide.md)."))
        agent = {
            "kind": "chat",
            "model": {"provider": "openai", "base_url": llm.base_url, "model": "m"},
        }
        r = client.post(
            "/v1/runs",
            json={
                "agent": agent,
                "input": "How do I restart it?",
                "quotes_from": {"dataset": "manuals", "k": 3},
            },
        )
        assert r.status_code == 201, r.text
        stub.drain(sqlite_rt)
        sent = str(llm.bodies[0]["messages"])
    assert client.get(f"/v1/runs/{r.json()['id']}").json()["status"] == "completed"
    assert "blue button restarts the machine" in sent and "guide.md" in sent


def test_an_uploads_file_name_is_kept_without_control_characters(client: TestClient) -> None:
    _dataset(client)
    body = (  # by hand: httpx would percent-encode the NUL a raw client can send
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="dir/no\x00tes\x07.txt"'
        b"\r\nContent-Type: text/plain\r\n\r\n" + NOTES.encode() + b"\r\n--b--\r\n"
    )
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    r = client.post("/v1/datasets/manuals/documents", content=body, headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "notes.txt"  # as /v1/files keeps a name (PostgreSQL: no NUL)
