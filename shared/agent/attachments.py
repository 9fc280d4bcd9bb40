"""A run's attachments in the model request (SPEC M-11), pure.

Images reach a vision profile as ``image_url`` content parts (data URLs the engine loaded);
a profile without vision gets one line saying so instead. Documents are never pasted into
the prompt: an agent is told their names and reads them with ``read_files``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.agent.messages import Message

__all__ = [
    "IMAGE_TYPES",
    "READ_FILES",
    "attachment_refs",
    "image_note",
    "image_refs",
    "is_image",
    "with_attachments",
]

READ_FILES = "read_files"
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def attachment_refs(inputs: Mapping[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """``inputs["attachments"]`` as refs ``{id, name, content_type, size, ...}`` (a bare id
    string, the form before submit resolved it, becomes ``{"id": ...}``)."""
    out = []
    for item in (inputs or {}).get("attachments") or ():
        if isinstance(item, str):
            out.append({"id": item, "name": item, "content_type": "", "size": 0})
        elif isinstance(item, Mapping) and item.get("id"):
            out.append(dict(item))
    return tuple(out)


def is_image(ref: Mapping[str, Any]) -> bool:
    return str(ref.get("content_type") or "") in IMAGE_TYPES


def image_refs(refs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in refs if is_image(r)]


def image_note(count: int) -> str:
    return f"[{count} image(s) attached but this model cannot see images]"


def _files_note(names: Sequence[str]) -> str:
    return f"[Attached files, not shown here; read them with {READ_FILES}: {', '.join(names)}]"


def _notes(refs: Sequence[Mapping[str, Any]], vision: bool, readable: bool) -> list[str]:
    notes = []
    images = image_refs(refs)
    if images and not vision:
        notes.append(image_note(len(images)))
    docs = [str(r.get("name") or r["id"]) for r in refs if not is_image(r)]
    if docs and readable:
        notes.append(_files_note(docs))
    return notes


def with_attachments(
    messages: Sequence[Message],
    inputs: Mapping[str, Any] | None,
    *,
    vision: bool,
    readable: bool,
) -> list[Message]:
    """The request messages with the run's attachments on the last user message: image parts
    (``inputs["images"]``: data URLs, for a vision profile) and one-line notes.
    ``readable``: the run has ``read_files`` (an agent), so documents are named."""
    refs = attachment_refs(inputs)
    if not refs:
        return list(messages)
    urls = [str(u) for u in (inputs or {}).get("images") or ()] if vision else []
    notes = _notes(refs, vision, readable)
    idx = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), None)
    if idx is None or not (urls or notes):
        return list(messages)
    out = list(messages)
    out[idx] = _decorate(messages[idx], urls, notes)
    return out


def _decorate(msg: Message, urls: Sequence[str], notes: Sequence[str]) -> Message:
    images = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    if isinstance(msg.content, list):  # already parts: keep them, add ours
        return msg.with_content(
            [*msg.content, *({"type": "text", "text": n} for n in notes), *images]
        )
    text = "\n\n".join(p for p in (msg.text, *notes) if p)
    if not images:
        return msg.with_content(text)
    return msg.with_content([{"type": "text", "text": text}, *images] if text else images)
