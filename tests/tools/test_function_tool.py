"""FunctionTool, ToolContext and the small built-ins (current_time, stop)."""

from __future__ import annotations

import pickle
import time
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, Field

from shared.errors import ToolError
from shared.tools import (
    FunctionTool,
    InvalidToolArguments,
    Tool,
    ToolContext,
    ToolResult,
    get,
)

CTX = ToolContext(run_id="run-1", call_id="call-9")


class Item(BaseModel):
    sku: str
    count: int = Field(ge=1)


class OrderArgs(BaseModel):
    """Not the tool description."""

    customer: str = Field(description="Customer id.")
    items: list[Item]
    note: str | None = None


def place_order(args: OrderArgs, ctx: ToolContext) -> str:
    """Place an order for a customer.

    Longer text that is not part of the description.
    """
    return f"{args.customer}: {sum(i.count for i in args.items)} items ({ctx.idempotency_key})"


ORDER = FunctionTool.from_function(place_order)


def test_function_tool_shape() -> None:
    assert isinstance(ORDER, Tool)
    assert ORDER.name == "place_order"
    assert ORDER.description == "Place an order for a customer."
    assert ORDER.read_only is False  # N-5: a write unless declared
    assert ORDER.internal is False
    schema = ORDER.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["customer", "items"]
    assert schema["properties"]["customer"] == {"description": "Customer id.", "type": "string"}
    assert "title" not in schema and "title" not in schema["$defs"]["Item"]
    assert "title" not in schema["$defs"]["Item"]["properties"]["sku"]


def test_property_named_title_survives() -> None:
    class Args(BaseModel):
        title: str

    def make(args: Args, ctx: ToolContext) -> str:
        return args.title

    made = FunctionTool.from_function(make, args_model=Args)
    assert made.parameters["properties"] == {"title": {"type": "string"}}


def test_execute_validates_and_wraps_text() -> None:
    result = ORDER.execute({"customer": "c1", "items": [{"sku": "a", "count": 2}]}, CTX)
    assert result == ToolResult(text="c1: 2 items (run-1:call-9)")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "Invalid arguments for place_order: customer: Field required; items: Field required"),
        (
            {"customer": "c", "items": [{"sku": "a", "count": "many"}]},
            "Invalid arguments for place_order: items.0.count: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            {"customer": "c", "items": [{"sku": "a", "count": 0}]},
            "Invalid arguments for place_order: items.0.count: Input should be greater than or "
            "equal to 1",
        ),
    ],
)
def test_validation_messages_are_short_and_readable(args: dict[str, object], expected: str) -> None:
    with pytest.raises(InvalidToolArguments) as info:
        ORDER.execute(args, CTX)
    assert str(info.value) == expected
    assert isinstance(info.value, ToolError)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_many_errors_are_summarised() -> None:
    items = [{"sku": 1, "count": "x"} for _ in range(5)]
    with pytest.raises(InvalidToolArguments, match=r"; and \d+ more$"):
        ORDER.execute({"customer": 1, "items": items}, CTX)


def test_tool_errors_pickle_for_celery() -> None:
    err = InvalidToolArguments("Invalid arguments for x: y: Field required")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is InvalidToolArguments and str(again) == str(err)


def test_function_needs_a_model_annotation() -> None:
    def bad(args: dict[str, object], ctx: ToolContext) -> str:
        return ""

    with pytest.raises(TypeError, match="pydantic model"):
        FunctionTool.from_function(bad)  # type: ignore[type-var]


def test_context_defaults_and_idempotency_key(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = ToolContext(run_id="r", call_id="c")
    assert ctx.idempotency_key == "r:c"
    monkeypatch.setenv("TREADLE_TEST_LATE", "set after the context was made")
    assert ctx.environ["TREADLE_TEST_LATE"] == "set after the context was made"
    assert ToolContext(run_id="r", call_id="c", env={"A": "1"}).environ == {"A": "1"}


def test_context_time_left() -> None:
    assert ToolContext(run_id="r", call_id="c").time_left(30) == 30
    soon = ToolContext(run_id="r", call_id="c", deadline=time.time() + 5)
    assert 4 < soon.time_left(30) <= 5
    assert soon.time_left(2) == 2
    with pytest.raises(ToolError, match="deadline exceeded"):
        ToolContext(run_id="r", call_id="c", deadline=time.time() - 1).time_left(30)


def test_current_time_defaults_to_utc() -> None:
    result = get("current_time").execute({}, CTX)
    now = datetime.fromisoformat(result.text)
    assert now.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - now).total_seconds()) < 5
    assert result.data is not None and result.data["timezone"] == "UTC"


def test_current_time_in_a_zone() -> None:
    result = get("current_time").execute({"timezone": "Asia/Tokyo"}, CTX)
    assert result.text.endswith("+09:00")
    assert abs((datetime.now(UTC) - datetime.fromisoformat(result.text)).total_seconds()) < 5
    assert result.data is not None and result.data["weekday"] in {
        "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
    }  # fmt: skip


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "/etc/localtime"])
def test_current_time_rejects_unknown_zones(zone: str) -> None:
    with pytest.raises(ToolError, match="unknown time zone"):
        get("current_time").execute({"timezone": zone}, CTX)


def test_stop_is_internal_and_signals_stop() -> None:
    stop = get("stop")
    assert stop.internal and stop.read_only
    assert stop.execute({}, CTX) == ToolResult(text="Stopped.", data={"reason": None}, stop=True)
    assert stop.execute({"reason": "done"}, CTX).data == {"reason": "done"}
