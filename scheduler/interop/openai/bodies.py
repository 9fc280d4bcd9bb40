"""The request body of ``POST /openai/v1/responses``, stated as the server checks it.

The route validates the body itself (errors in OpenAI's shape, 400), so the schema is given to
the OpenAPI document by hand (``CREATE_REQUEST``). A new response needs at least one message
and no resume items; ``function_call_output`` and ``mcp_approval_response`` items answer a
paused response and come with its ``previous_response_id``. Items of other types are accepted
and ignored. Not supported: ``tools`` (the agent's own tools run in treadle) and
``store: false`` with ``background: true``. One rule no schema can state is left to the
description: the last message must be the user's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from scheduler.http.openapi import REF_TEMPLATE, inline
from scheduler.interop.common import Content, Role

__all__ = ["CREATE_REQUEST", "RESUME_TYPES", "CreateBody"]

RESUME_TYPES = ("function_call_output", "mcp_approval_response")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class MessageItem(_Open):
    type: Literal["message"] = "message"
    role: Role
    content: Content = ""


class FunctionCallOutput(_Open):
    type: Literal["function_call_output"]
    call_id: str
    output: Any = None


class ApprovalResponse(_Open):
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    reason: str | None = Field(
        default=None, description="With approve false: what the model reads (Declined by user: …)"
    )
    arguments: dict[str, Any] | str | None = Field(
        default=None,
        description="treadle extension, with approve true: run the call with these arguments "
        "instead (an object or its JSON text; checked against the tool's schema)",
    )


_KNOWN = ["message", *RESUME_TYPES]
_OTHER_ITEM: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string", "not": {"enum": _KNOWN}}},
    "description": "An item of another type: ignored",
}
Item = MessageItem | FunctionCallOutput | ApprovalResponse | dict[str, Any]


def _is_resume(item: Item) -> bool:
    return isinstance(item, FunctionCallOutput | ApprovalResponse)


class CreateBody(_Open):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200, description="A registered agent's name")
    input: str | list[Item] = Field(
        description="The question, or input items (the last message must be the user's)"
    )
    background: StrictBool | None = None
    stream: StrictBool | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=200)
    metadata: dict[str, Any] | None = None
    store: StrictBool | None = None
    tools: list[Any] | None = Field(default=None, max_length=0, description="Not supported")

    @model_validator(mode="after")
    def _checks(self) -> CreateBody:
        if self.store is False and self.background:
            raise ValueError("background responses are stored: store=false is not supported")
        if isinstance(self.input, list):
            for item in self.input:
                kind = item.get("type") if isinstance(item, dict) else None
                if isinstance(item, dict) and (not isinstance(kind, str) or kind in _KNOWN):
                    raise ValueError(f"input: a malformed item (type {kind!r})")
            if self.previous_response_id is None:
                if any(_is_resume(it) for it in self.input):
                    raise ValueError(
                        "function_call_output and mcp_approval_response items answer a "
                        "paused response: send them with its previous_response_id"
                    )
                if not any(isinstance(it, MessageItem) for it in self.input):
                    raise ValueError("input: at least one message is needed")
        return self

    def items(self) -> list[dict[str, Any]]:
        """The input as plain items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [
            it if isinstance(it, dict) else it.model_dump(exclude_none=True) for it in self.input
        ]


def _schema() -> dict[str, Any]:
    """``CreateBody``'s JSON schema with the rules its validator checks spelled out."""
    schema = CreateBody.model_json_schema(ref_template=REF_TEMPLATE)
    items = schema["properties"]["input"]["anyOf"][1]["items"]
    items["anyOf"] = [a for a in items["anyOf"] if "$ref" in a] + [_OTHER_ITEM]
    resume = {"required": ["type"], "properties": {"type": {"enum": list(RESUME_TYPES)}}}
    new_response = {
        "anyOf": [
            {"not": {"required": ["previous_response_id"]}},
            {"properties": {"previous_response_id": {"type": "null"}}},
        ]
    }
    schema["allOf"] = [
        {  # store=false with background=true
            "not": {
                "required": ["store", "background"],
                "properties": {"store": {"const": False}, "background": {"const": True}},
            }
        },
        {  # a new response: a message, no resume items
            "if": new_response,
            "then": {
                "properties": {
                    "input": {
                        "anyOf": [
                            {"type": "string"},
                            {
                                "type": "array",
                                "contains": {"$ref": REF_TEMPLATE.format(model="MessageItem")},
                                "not": {"contains": resume},
                            },
                        ]
                    }
                }
            },
        },
    ]
    return schema


CREATE_REQUEST: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": inline(_schema())}},
    }
}
