"""The OpenAPI document, with the errors every operation can answer.

Every error body is ``{"error": {"code", "message", "details"?}}`` (``scheduler.http.errors``): the
validation error (422) included, which FastAPI would otherwise document in its own shape. Any
operation may also meet the body-size limit (413), a body that does not parse (400) or, behind
a key, 401/403/429; each operation gets those responses unless it documents them itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from scheduler.http.nul_free import state_in_schema
from scheduler.http.schemas import ERROR_RESPONSES, ErrorBody
from shared.config import Settings, get_settings
from shared.engine.guard_plugins import plugin_names
from shared.engine.handlers import handler_names
from shared.engine.spec_policy import SCHEMA_MAXIMA
from shared.tools.registry import REGISTRY

__all__ = ["REF_TEMPLATE", "component", "inline", "install_openapi"]

REF_TEMPLATE = "#/components/schemas/{model}"
_COMPONENTS: dict[str, dict[str, Any]] = {}

_REF = "#/components/schemas/ErrorBody"
_GENERAL = {400: "The body does not parse (not JSON, not UTF-8, broken multipart)"}
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"
_METHODS = frozenset({"get", "put", "post", "delete", "patch", "options", "head", "trace"})


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF}}}}


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


def component(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Add a JSON schema built with ``REF_TEMPLATE`` (and its ``$defs``) to the document's
    components, for a body a route reads itself; returns a ``$ref`` to it."""
    schema = dict(schema)
    _COMPONENTS.update(schema.pop("$defs", {}))
    _COMPONENTS[name] = schema
    return {"$ref": REF_TEMPLATE.format(model=name)}


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A body schema built with ``REF_TEMPLATE`` given in place, its ``$defs`` added to the
    document's components. (A body whose schema is itself a ``$ref`` and that holds a
    recursive one leaves schemathesis unable to route around an array's ``contains`` that its
    negative data contradicts: ``Cannot generate an array with 1 demanded elements``.)"""
    schema = dict(schema)
    _COMPONENTS.update(schema.pop("$defs", {}))
    return schema


def _components(schema: dict[str, Any]) -> None:
    defs = schema.setdefault("components", {}).setdefault("schemas", {})
    defs.update(_COMPONENTS)
    body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    defs.update(body.pop("$defs", {}))
    defs["ErrorBody"] = body
    for unused in ("HTTPValidationError", "ValidationError"):
        if unused not in str(schema.get("paths")):
            defs.pop(unused, None)


def _tool_names(schema: dict[str, Any]) -> None:
    """An agent spec names registered tools: their names as an enum (the registry is filled
    when the runtime starts, before the API serves)."""
    spec = schema.get("components", {}).get("schemas", {}).get("AgentSpec")
    if spec is None:
        return
    tools = spec["properties"]["tools"]
    for branch in tools["items"]["anyOf"]:
        if branch.get("type") == "string":
            branch["enum"] = REGISTRY.names()
            branch["description"] = "A registered tool's name"
    tools["description"] = (
        "Registered tools by name and inline tools; tool names are unique within a spec "
        "(a rule a schema cannot state across the two forms: a duplicate is a 422)"
    )


def _handler_names(schema: dict[str, Any]) -> None:
    """A router rule that answers locally (a handler, not passed to the model) names a
    registered handler (``shared.engine.handlers.check_router``): the schema says which."""
    rule = schema.get("components", {}).get("schemas", {}).get("RouterRule")
    if rule is None:
        return
    local = {
        "properties": {
            "pass_to_model": {"const": False},
            "handler": {"type": "string", "minLength": 1},
        },
        "required": ["handler"],
    }
    known = {"properties": {"handler": {"enum": handler_names()}}}
    rule.setdefault("allOf", []).append({"if": local, "then": known})


def _guardrail_plugins(schema: dict[str, Any]) -> None:
    """A plugin guardrail names a registered plugin (``shared.engine.guard_plugins``): the
    schema says which."""
    guard = schema.get("components", {}).get("schemas", {}).get("GuardrailSpec")
    if guard is None:
        return
    for branch in guard["properties"]["plugin"].get("anyOf", ()):
        if branch.get("type") == "string":
            branch["enum"] = plugin_names()
            branch["description"] = "A registered guardrail plugin's name"


def _assistant_context(schema: dict[str, Any]) -> None:
    """A LangGraph assistant's ``context`` is a set of agent spec fields, checked as a spec
    (``scheduler.interop.langgraph.assistants``): the schema says so."""
    defs = schema.get("components", {}).get("schemas", {})
    spec = {"$ref": "#/components/schemas/AgentSpec"}
    for name, body in defs.items():
        context = body.get("properties", {}).get("context")
        if name.startswith("AssistantBody") and context is not None and "AgentSpec" in defs:
            body["properties"]["context"] = {"anyOf": [spec, {"type": "null"}]}


NO_CONTROL = r"^[^\u0000-\u001f\u007f]*$"
"""Path and query strings carry no control character (``scheduler.http.bodyguard`` refuses
them before any route): the schema says so for each one that has no pattern of its own."""


def _no_control(operation: dict[str, Any]) -> None:
    for param in operation.get("parameters") or ():
        if param.get("in") in ("path", "query"):
            _pattern(param.get("schema") or {})


def _pattern(schema: dict[str, Any]) -> None:
    """The rule on every string of a parameter's schema (arrays' items and unions too)."""
    if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema:
        schema["pattern"] = NO_CONTROL
    for branch in schema.get("anyOf") or ():
        _pattern(branch)
    if isinstance(schema.get("items"), dict):
        _pattern(schema["items"])


def _maxima(schema: dict[str, Any], settings: Settings) -> None:
    """The operator's maxima on what a submitted spec sets (``spec_policy.SCHEMA_MAXIMA``)."""
    defs = schema.get("components", {}).get("schemas", {})
    for component, field, setting in SCHEMA_MAXIMA:
        prop = defs.get(component, {}).get("properties", {}).get(field)
        if prop is None:
            continue
        limit = getattr(settings, setting)
        for branch in [prop, *(prop.get("anyOf") or ())]:
            if branch.get("type") in ("number", "integer"):
                branch["maximum"] = limit
        prop["description"] = (
            f"{prop.get('description', '')} At most {limit:g} (TREADLE_{setting.upper()})."
        ).strip()


def install_openapi(app: FastAPI, settings: Callable[[], Settings] | None = None) -> None:
    """``app.openapi()`` (and ``/openapi.json``) with every error response documented and
    the operator's limits (``settings``: the running app's) stated."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            errors = _errors()
            for item in schema.get("paths", {}).values():
                for method, operation in item.items():
                    if method in _METHODS:
                        _patch_operation(operation, errors)
                        _no_control(operation)
            _components(schema)
            _tool_names(schema)
            _handler_names(schema)
            _guardrail_plugins(schema)
            _assistant_context(schema)
            _maxima(schema, (settings or get_settings)())
            state_in_schema(schema)  # last: the strings the steps above added included
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
