"""The registry: @tool, entry points, resolve() of an agent spec's tools, tool_defs()."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from shared.agent.spec import AgentSpec, InlineTool
from shared.errors import SpecError
from shared.llm.base import ToolDef
from shared.tools import (
    REGISTRY,
    FunctionTool,
    HttpTool,
    Registry,
    Tool,
    ToolContext,
    ToolResult,
    get,
    resolve,
    tool,
    tool_defs,
)
from shared.tools.builtins import calculator


class EchoArgs(BaseModel):
    text: str


def _echo(args: EchoArgs, ctx: ToolContext) -> str:
    """Echo the text."""
    return args.text


@dataclass(frozen=True)
class PlainTool:
    """A Tool written by hand, not from a function."""

    name: str = "plain"
    description: str = "A plain tool."
    parameters: Any = None
    read_only: bool = True
    internal: bool = False

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(text="plain")


class FakeEntryPoint:
    def __init__(self, name: str, obj: object = None, error: Exception | None = None) -> None:
        self.name, self.value, self._obj, self._error = name, f"fake:{name}", obj, error

    def load(self) -> object:
        if self._error is not None:
            raise self._error
        return self._obj


def test_decorator_registers_a_function_tool() -> None:
    reg = Registry(group=None)

    @tool("say", description="Say it.", read_only=True, registry=reg)
    def say(args: EchoArgs, ctx: ToolContext) -> str:
        return args.text

    assert isinstance(say, FunctionTool)
    assert reg.get("say") is say
    assert (say.name, say.description, say.read_only, say.internal) == (
        "say",
        "Say it.",
        True,
        False,
    )
    assert say.execute({"text": "hi"}, ToolContext(run_id="r", call_id="c")).text == "hi"


def test_decorator_defaults_come_from_the_function() -> None:
    reg = Registry(group=None)
    made = tool(registry=reg)(_echo)
    assert (made.name, made.description, made.read_only) == ("_echo", "Echo the text.", False)


def test_names_are_unique_and_valid() -> None:
    reg = Registry(group=None)
    first = reg.add(FunctionTool.from_function(_echo, name="echo"))
    assert reg.add(first) is first  # the same object again is a no-op
    with pytest.raises(ValueError, match="already registered"):
        reg.add(FunctionTool.from_function(_echo, name="echo"))
    with pytest.raises(ValueError, match="invalid tool name"):
        reg.add(FunctionTool.from_function(_echo, name="has space"))


def test_get_unknown_raises_key_error() -> None:
    with pytest.raises(KeyError):
        Registry(group=None).get("nope")


def test_builtins_are_in_the_global_registry() -> None:
    assert {"calculator", "current_time", "http_get", "stop"} <= set(REGISTRY.names())
    assert get("calculator") is calculator


def test_resolve_names_and_inline_http_tools() -> None:
    spec = AgentSpec.model_validate(
        {
            "tools": [
                "calculator",
                {
                    "name": "create_ticket",
                    "description": "Create a support ticket.",
                    "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
                    "http": {"method": "POST", "url": "https://tickets.example/api"},
                },
            ]
        }
    )
    calc, ticket = resolve(spec.tools)
    assert calc is calculator
    assert isinstance(ticket, HttpTool) and isinstance(ticket, Tool)
    assert (ticket.name, ticket.read_only, ticket.internal) == ("create_ticket", False, False)


def test_resolve_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(SpecError) as info:
        resolve(["calculator", "teleport"])
    assert "unknown tool 'teleport'" in str(info.value)
    for name in ("calculator", "current_time", "http_get"):
        assert name in str(info.value)


def test_resolve_rejects_duplicates_and_inline_tools_without_http() -> None:
    with pytest.raises(SpecError, match="duplicate tool names: calculator"):
        resolve(["calculator", "stop", "calculator"])
    with pytest.raises(SpecError, match="has no `http` section"):
        resolve([InlineTool(name="sub", agent="helper")])
    with pytest.raises(ValidationError, match="http.url"):
        InlineTool.model_validate({"name": "x", "http": {"url": "file:///etc/x"}})


def test_tool_defs() -> None:
    defs = tool_defs([calculator, PlainTool()])
    assert defs[0] == ToolDef("calculator", calculator.description, calculator.parameters)
    assert defs[0].to_wire()["function"]["name"] == "calculator"
    assert defs[1].name == "plain"


def test_entry_points_load_once(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = FunctionTool.from_function(_echo, name="from_factory")
    eps = [
        FakeEntryPoint("a_tool", PlainTool()),
        FakeEntryPoint("a_factory", lambda: [extra, PlainTool(name="second")]),
        FakeEntryPoint("a_class", type("Made", (PlainTool,), {})),
        FakeEntryPoint("broken", error=ImportError("no such module")),
        FakeEntryPoint("junk", 42),
        FakeEntryPoint("returns_junk", lambda: "not tools"),
        FakeEntryPoint("clash", PlainTool(description="same name, other object")),
    ]
    calls: list[str] = []

    def entry_points(*, group: str) -> list[FakeEntryPoint]:
        calls.append(group)
        return eps

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    reg = Registry()
    assert reg.get("plain").description == "A plain tool."  # first lookup loads the group
    assert reg.names() == ["from_factory", "plain", "second"]
    assert reg.load_entry_points() == []
    assert calls == ["treadle.tools"]


def test_entry_point_class_is_instantiated(monkeypatch: pytest.MonkeyPatch) -> None:
    made = type("Made", (PlainTool,), {})
    monkeypatch.setattr(metadata, "entry_points", lambda *, group: [FakeEntryPoint("c", made)])
    reg = Registry()
    assert reg.load_entry_points() == ["plain"]
    assert type(reg.get("plain")) is made


def test_real_entry_point_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = metadata.EntryPoint(
        name="calc", value="shared.tools.builtins:calculator", group="treadle.tools"
    )
    monkeypatch.setattr(metadata, "entry_points", lambda *, group: [ep])
    reg = Registry()
    assert reg.load_entry_points() == ["calculator"]
    assert reg.get("calculator") is calculator


def test_registry_is_thread_safe() -> None:
    reg = Registry(group=None)
    barrier = threading.Barrier(8)

    def add(i: int) -> None:
        barrier.wait()
        for j in range(25):
            reg.add(FunctionTool.from_function(_echo, name=f"t{i}_{j}"))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reg.names()) == 200
