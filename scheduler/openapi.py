"""The OpenAPI document, with the errors every operation can answer (issue #11).

Every error body is ``{"error": {"code", "message", "details"?}}`` (``scheduler.errors``): the
validation error (422) included, which FastAPI would otherwise document in its own shape. Any
operation may also meet the body-size limit (413), a body that does not parse (400) or, behind
a key, 401/403/429; each operation gets those responses unless it documents them itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from scheduler.schemas import ERROR_RESPONSES, ErrorBody

__all__ = ["install_openapi"]

_REF = "#/components/schemas/ErrorBody"
_GENERAL = {400: "The body does not parse (not JSON, not UTF-8, broken multipart)"}
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"
_METHODS = frozenset({"get", "put", "post", "delete", "patch", "options", "head", "trace"})


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": _REF}}}}


def _errors() -> dict[str, str]:
    found = {str(code): str(spec["description"]) for code, spec in ERROR_RESPONSES.items()}
    return {**{str(c): d for c, d in _GENERAL.items()}, **found}


def _patch_operation(operation: dict[str, Any], errors: dict[str, str]) -> None:
    responses = operation.setdefault("responses", {})
    for code, description in errors.items():
        existing = responses.get(code)
        fastapi_default = existing is not None and _FASTAPI_422 in str(existing)
        if existing is None or fastapi_default:
            responses[code] = _error(description)


def _components(schema: dict[str, Any]) -> None:
    defs = schema.setdefault("components", {}).setdefault("schemas", {})
    body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    defs.update(body.pop("$defs", {}))
    defs["ErrorBody"] = body
    for unused in ("HTTPValidationError", "ValidationError"):
        if unused not in str(schema.get("paths")):
            defs.pop(unused, None)


def install_openapi(app: FastAPI) -> None:
    """``app.openapi()`` (and ``/openapi.json``) with every error response documented."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            errors = _errors()
            for item in schema.get("paths", {}).values():
                for method, operation in item.items():
                    if method in _METHODS:
                        _patch_operation(operation, errors)
            _components(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
