"""The NUL rule is in the OpenAPI document wherever the API checks it (``scheduler.http.nul_free``):
every string a JSON request body (or a documented header) can hold excludes NUL, every free key
does, every value of any type is ``NulFreeJson``; a multipart text field that is checked says so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.http.nul_free import NUL_FREE, NULFREE_JSON, admits_nul
from shared.engine.runtime import Runtime

_FREE_FORMATS = {"date-time", "date", "time", "duration", "uuid", "email", "uri", "byte"}
_NOTES = {"title", "description", "default", "examples", "deprecated"}


@pytest.mark.parametrize(
    ("pattern", "admits"),
    [
        (NUL_FREE, False),
        (r"^[A-Za-z0-9_-]{1,64}$", False),
        (r"^[^.\x00-\x1f\x7f]{1,64}$", False),
        (r"^\*$|^[^.\x00]{1,64}$", False),  # the parser hoists the shared ``^``
        (r"(^a$)|(^b$)", False),
        (r"^\d+$", False),
        (r"^\$", True),  # unanchored at the end: anything may follow
        (r"^a|b$", True),
        (r"[^\x09-\x0d]", True),  # "holds a non-blank character": NUL is one
        (r"^data:[^,]*;base64,$", True),
        (r"^.$", True),
        (r"^\S$", True),
        (r"^[\x00-\x1f]$", True),
        (r"^(a)\1$", True),  # a back-reference: unsure, so yes
    ],
)
def test_admits_nul(pattern: str, admits: bool) -> None:
    assert admits_nul(pattern) is admits


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(lambda: None, auth="required").openapi()  # type: ignore[arg-type, return-value]


def _json_bodies(doc: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The schemas of JSON bodies and of documented headers, by operation."""
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            for param in operation.get("parameters") or ():
                if param["in"] == "header":
                    yield f"{method.upper()} {path} {param['name']}", param["schema"]
            content = (operation.get("requestBody") or {}).get("content") or {}
            for media, body in content.items():
                if not media.startswith("multipart/"):
                    yield f"{method.upper()} {path}", body["schema"]


def _positions(node: Any, where: str, comps: dict[str, Any], seen: set[str]) -> Iterator[Any]:
    """Every value position under ``node`` (refs followed once), with where it is."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name not in seen:
            seen.add(name)
            yield from _positions(comps[name], name, comps, seen)
        yield where, node
        return
    yield where, node
    children = [
        *(node.get("properties") or {}).items(),
        *(node.get("patternProperties") or {}).items(),
    ]
    children += [(k, node[k]) for k in ("additionalProperties", "items") if k in node]
    children += [
        (f"{k}{i}", b) for k in ("anyOf", "oneOf", "allOf") for i, b in enumerate(node.get(k) or ())
    ]
    for key, child in children:
        yield from _positions(child, f"{where}.{key}", comps, seen)


def _excludes_nul(node: dict[str, Any]) -> bool:
    if "enum" in node or "const" in node or node.get("format") in _FREE_FORMATS:
        return True
    patterns = [node.get("pattern"), *(part.get("pattern") for part in node.get("allOf") or ())]
    return any(p is not None and not admits_nul(p) for p in patterns)


def test_every_string_and_key_of_a_json_body_excludes_nul(document: dict[str, Any]) -> None:
    comps = document["components"]["schemas"]
    seen: set[str] = set()
    missing = []
    for label, schema in _json_bodies(document):
        for where, node in _positions(schema, label, comps, seen):
            kinds = node.get("type")
            kinds = kinds if isinstance(kinds, list) else [kinds]
            if not (set(node) - _NOTES):
                missing.append(f"{where}: a value of any type")
            if "string" in kinds and not _excludes_nul(node):
                missing.append(f"{where}: a string")
            free_keys = node.get("additionalProperties", True) is not False
            if "object" in kinds and free_keys and "propertyNames" not in node:
                missing.append(f"{where}: an object's keys")
    assert len(seen) > 50  # the walk reached the components
    assert missing == []


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ({"a": [1, "x", None, {"b": True}]}, True),
        ("text", True),
        ({"a": ["x\x00"]}, False),
        ({"\x00": 1}, False),
        ([[["\x00"]]], False),
    ],
)
def test_any_value_is_nul_free(document: dict[str, Any], value: Any, valid: bool) -> None:
    schema = {"$ref": f"#/components/schemas/{NULFREE_JSON}", **document}
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is valid


def test_a_multipart_document_name_with_nul_is_refused(sqlite_rt: Runtime) -> None:
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        assert client.post("/v1/datasets", json={"name": "kb"}).status_code == 201
        files = {"file": (None, "some text"), "name": (None, "a\x00b")}
        response = client.post("/v1/datasets/kb/documents", files=files)
        assert response.status_code == 422, response.text
        assert "NUL" in response.json()["error"]["message"]
        files = {"file": (None, "some text"), "name": (None, "ab")}
        assert client.post("/v1/datasets/kb/documents", files=files).status_code == 201
