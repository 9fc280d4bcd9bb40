"""SPEC M-11 in the pure core: where image parts and notes go in the request."""

from __future__ import annotations

from shared.agent.attachments import attachment_refs, image_note, with_attachments
from shared.agent.messages import Message

IMG = {"id": "file_i", "name": "a.png", "content_type": "image/png", "size": 10}
DOC = {"id": "file_d", "name": "r.pdf", "content_type": "application/pdf", "size": 10}
URL = "data:image/png;base64,AAAA"


def _msgs() -> list[Message]:
    return [
        Message(role="system", content="sys"),
        Message(role="user", content="first"),
        Message(role="assistant", content="a"),
        Message(role="user", content="second"),
        Message(role="tool", content="t", tool_call_id="c"),
    ]


def test_no_attachments_no_change() -> None:
    assert with_attachments(_msgs(), {}, vision=True, readable=True) == _msgs()


def test_vision_parts_on_the_last_user_message() -> None:
    out = with_attachments(
        _msgs(), {"attachments": [IMG], "images": [URL]}, vision=True, readable=True
    )
    assert out[1].content == "first"
    assert out[3].content == [
        {"type": "text", "text": "second"},
        {"type": "image_url", "image_url": {"url": URL}},
    ]
    assert out[4] == _msgs()[4]


def test_no_vision_note_and_document_names() -> None:
    out = with_attachments(
        _msgs(), {"attachments": [IMG, DOC], "images": [URL]}, vision=False, readable=True
    )
    assert out[3].content == (
        f"second\n\n{image_note(1)}\n\n"
        "[Attached files, not shown here; read them with read_files: r.pdf]"
    )
    chat = with_attachments(_msgs(), {"attachments": [DOC]}, vision=False, readable=False)
    assert chat == _msgs()  # no read_files: nothing to say about documents


def test_existing_parts_are_kept() -> None:
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "u"}}]
    msgs = [Message(role="user", content=parts)]
    out = with_attachments(
        msgs, {"attachments": [IMG, DOC], "images": [URL]}, vision=True, readable=True
    )
    assert out[0].content == [
        *parts,
        {
            "type": "text",
            "text": "[Attached files, not shown here; read them with read_files: r.pdf]",
        },
        {"type": "image_url", "image_url": {"url": URL}},
    ]


def test_refs_accept_bare_ids() -> None:
    assert attachment_refs({"attachments": ["file_x", DOC, 3]}) == (
        {"id": "file_x", "name": "file_x", "content_type": "", "size": 0},
        DOC,
    )
