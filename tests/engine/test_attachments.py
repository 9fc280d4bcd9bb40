"""Attachments in runs (SPEC M-11): ``read_files`` reads documents (PDF as text,
paged), images reach vision profiles as image parts and others as a one-line note."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.attachments import image_note
from shared.agent.spec import AgentSpec
from shared.engine.catalog import build_catalog
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.tools.files import PAGE_CHARS, page_spans
from tests.engine.helpers import call
from tests.files_support import tiny_pdf, tiny_png

PDF_PAGES = [["Quarterly report (Q3)", "Revenue: 42 million"], ["Outlook: steady growth"]]
NOTES = b"Meeting notes\nShip on Friday.\n"


@pytest.fixture
def client(sqlite_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: sqlite_rt)) as c:
        yield c


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def upload(client: TestClient, name: str, data: bytes) -> dict[str, Any]:
    r = client.post("/v1/files", files={"file": (name, data)})
    assert r.status_code == 201, r.text
    return dict(r.json())


def scripted(*replies: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"kind": "agent", "model": {"provider": "scripted", "replies": list(replies)}, **spec}


def run_to_end(
    client: TestClient,
    rt: Runtime,
    stub: StubBroker,
    agent: dict[str, Any],
    attachments: list[str],
    text: str = "Summarize the files.",
) -> dict[str, Any]:
    r = client.post("/v1/runs", json={"agent": agent, "input": text, "attachments": attachments})
    assert r.status_code == 201, r.text
    stub.drain(rt)
    return dict(client.get(f"/v1/runs/{r.json()['id']}").json())


def tool_results(client: TestClient, run_id: str) -> dict[str, str]:
    msgs = client.get(f"/v1/runs/{run_id}/messages").json()["messages"]
    return {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}


def test_read_files_on_a_pdf_and_a_text_file(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # upload a PDF and a text file; the agent reads both with read_files
    pdf = upload(client, "report.pdf", tiny_pdf(PDF_PAGES))
    txt = upload(client, "notes.txt", NOTES)
    agent = scripted(
        {
            "tool_calls": [
                call("read_files", {"file": "report.pdf"}, "r1"),
                call("read_files", {"file": txt["id"]}, "r2"),
            ]
        },
        {"text": "Revenue was 42 million; ship on Friday."},
    )
    run = run_to_end(client, sqlite_rt, stub, agent, [pdf["id"], txt["id"]])
    assert (run["status"], run["result"]["text"]) == (
        "completed",
        "Revenue was 42 million; ship on Friday.",
    )
    results = tool_results(client, run["id"])
    assert "Revenue: 42 million" in results["r1"] and "Outlook: steady growth" in results["r1"]
    assert results["r1"].startswith("[report.pdf (application/pdf): page 1 of 1,")
    assert "--- page 2 ---" in results["r1"]  # the PDF's own pages are marked
    assert (
        results["r2"] == f"[notes.txt (text/plain): page 1 of 1, characters 1-{len(NOTES)} "
        f"of {len(NOTES)}]\n{NOTES.decode()}"
    )
    msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
    assert msgs[0]["content"] == "Summarize the files."  # never pasted into the prompt


def test_a_2mb_file_is_paged(client: TestClient, sqlite_rt: Runtime, stub: StubBroker) -> None:
    lines = [f"line {i:06d}: " + "lorem ipsum dolor sit amet " * 3 for i in range(22_000)]
    text = "\n".join(lines)
    assert len(text) > 2_000_000
    big = upload(client, "big.txt", text.encode())
    pages = len(page_spans(text))
    agent = scripted(
        {
            "tool_calls": [
                call("read_files", {"file": "big.txt"}, "p1"),
                call("read_files", {"file": "big.txt", "page": 2}, "p2"),
                call("read_files", {"file": "big.txt", "page": pages}, "pz"),
                call("read_files", {"file": "big.txt", "page": pages + 1}, "past"),
            ]
        },
        {"text": "done"},
    )
    run = run_to_end(client, sqlite_rt, stub, agent, [big["id"]])
    assert run["status"] == "completed"
    r = tool_results(client, run["id"])
    assert pages >= 250
    assert r["p1"].startswith(f"[big.txt (text/plain): page 1 of {pages}, characters 1-")
    assert r["p1"].endswith("[... continued: call read_files with page=2]")
    assert r["p2"].startswith(f"[big.txt (text/plain): page 2 of {pages}, characters ")
    assert all(len(r[k]) <= PAGE_CHARS + 200 for k in ("p1", "p2", "pz"))
    body1 = r["p1"].split("\n", 1)[1].removesuffix("\n[... continued: call read_files with page=2]")
    body2 = r["p2"].split("\n", 1)[1].removesuffix("\n[... continued: call read_files with page=3]")
    assert text.startswith(body1 + body2)  # consecutive pages, nothing lost between them
    assert r["pz"].rstrip().endswith(lines[-1].rstrip())
    assert r["past"] == f"Tool error: big.txt has {pages} page(s); page {pages + 1} is past the end"


def test_read_files_errors_are_results_and_the_run_goes_on(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC L-5: an unknown name, a bad page, an image, no `file` (a listing)
    txt = upload(client, "a.txt", b"alpha")
    png = upload(client, "dot.png", tiny_png())
    agent = scripted(
        {
            "tool_calls": [
                call("read_files", {"file": "nope.pdf"}, "e1"),
                call("read_files", {"file": "a.txt", "page": 0}, "e2"),
                call("read_files", {"file": "dot.png"}, "e3"),
                call("read_files", {}, "e4"),
            ]
        },
        {"text": "ok"},
    )
    run = run_to_end(client, sqlite_rt, stub, agent, [txt["id"], png["id"]])
    assert run["status"] == "completed"
    r = tool_results(client, run["id"])
    assert r["e1"].startswith("Tool error: no attached file 'nope.pdf'. Attached files:")
    assert r["e2"].startswith("Invalid arguments for read_files:") and "page" in r["e2"]
    assert r["e3"].startswith("Tool error: dot.png is an image (image/png)")
    assert txt["id"] in r["e4"] and png["id"] in r["e4"]


def test_read_files_only_with_documents_and_reserved() -> None:
    spec = AgentSpec.model_validate(scripted({"text": "x"}, tools=["calculator"]))
    doc = {"id": "file_1", "name": "a.txt", "content_type": "text/plain", "size": 5}
    img = {"id": "file_2", "name": "b.png", "content_type": "image/png", "size": 5}
    assert "read_files" not in build_catalog(spec).entries
    assert "read_files" not in build_catalog(spec, attachments=[img]).entries
    entry = build_catalog(spec, attachments=[doc, img]).entries["read_files"]
    assert entry.read_only and not entry.internal and "a.txt" in entry.description
    chat = AgentSpec.model_validate({"kind": "chat", "model": "demo"})
    assert build_catalog(chat, attachments=[doc]).entries == {}
    # a business tool may not take the name (SPEC P-5)
    inline = {"name": "read_files", "http": {"url": "https://example.com"}}
    shadow = AgentSpec.model_validate(scripted({"text": "x"}, tools=[inline]))
    cat = build_catalog(shadow, attachments=[doc])
    assert cat.warnings and "read_files" in cat.warnings[0]
    assert cat.tools["read_files"].description.startswith("Read a file attached")


# --- vision, asserted on the fake server's recorded requests ------------------


def _profile(llm: FakeLLMServer, vision: bool) -> dict[str, Any]:
    return {"provider": "openai", "base_url": llm.base_url, "model": "m", "vision": vision}


def _last_user(body: dict[str, Any]) -> dict[str, Any]:
    return [m for m in body["messages"] if m["role"] == "user"][-1]


def _image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for m in body["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") == "image_url"
    ]


def test_vision_profile_receives_the_image_part(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    png = tiny_png()
    img = upload(client, "dot.png", png)
    doc = upload(client, "notes.md", b"# Secret plan\nBuy low.\n")
    llm.script(
        ReplySpec(
            tool_calls=[{"id": "c1", "name": "read_files", "arguments": {"file": "notes.md"}}]
        ),
        ReplySpec(text="A red dot, and a plan."),
    )
    agent = {"kind": "agent", "model": _profile(llm, True)}
    run = run_to_end(client, sqlite_rt, stub, agent, [img["id"], doc["id"]], "What is this?")
    assert run["status"] == "completed"
    assert len(llm.requests) == 2
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    for req in llm.requests:  # every round's request carries the image
        user = _last_user(req.body)
        assert isinstance(user["content"], list)
        assert user["content"][0]["type"] == "text"
        assert user["content"][0]["text"].startswith("What is this?")
        assert _image_parts(req.body) == [{"type": "image_url", "image_url": {"url": url}}]
        assert "[Attached files" in user["content"][0]["text"]  # the document is named...
        assert "Buy low." not in json.dumps(req.body["messages"][:2])  # ...not pasted
        assert "image(s) attached" not in json.dumps(req.body)
    assert "read_files" in [t["function"]["name"] for t in llm.requests[0].body["tools"]]
    assert "Buy low." in llm.requests[1].body["messages"][-1]["content"]  # read when asked


def test_non_vision_profile_gets_a_note_and_no_image(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    img1 = upload(client, "a.png", tiny_png())
    img2 = upload(client, "b.png", tiny_png())
    llm.script(ReplySpec(text="I cannot see them."))
    agent = {"kind": "agent", "model": _profile(llm, False)}
    run = run_to_end(client, sqlite_rt, stub, agent, [img1["id"], img2["id"]], "Describe these.")
    assert run["status"] == "completed"
    body = llm.requests[0].body
    assert _image_parts(body) == []
    assert "image_url" not in json.dumps(body) and "base64" not in json.dumps(body)
    assert _last_user(body)["content"] == f"Describe these.\n\n{image_note(2)}"
    assert image_note(2) == "[2 image(s) attached but this model cannot see images]"
    assert "tools" not in body  # images only: no read_files


def test_inline_data_url_image_reaches_a_vision_chat(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    png = tiny_png()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    llm.script(ReplySpec(text="Red."))
    agent = {"kind": "chat", "model": _profile(llm, True)}
    run = run_to_end(client, sqlite_rt, stub, agent, [url], "Colour?")
    assert run["status"] == "completed" and run["result"]["text"] == "Red."
    parts = _last_user(llm.requests[0].body)["content"]
    assert parts == [
        {"type": "text", "text": "Colour?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]


def test_the_model_view_is_not_stored_with_images(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # the stored transcript keeps the user's text: image bytes are added per request
    img = upload(client, "a.png", tiny_png())
    llm.script(ReplySpec(text="ok"))
    run = run_to_end(
        client,
        sqlite_rt,
        stub,
        {"kind": "agent", "model": _profile(llm, True)},
        [img["id"]],
        "Look.",
    )
    msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
    assert msgs[0]["content"] == "Look."
    assert not re.search("base64", json.dumps(msgs))
