"""Built-in tools: ``calculator``, ``current_time``, ``http_get`` and ``stop`` (SPEC L-6)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from shared.errors import ToolError
from shared.tools.base import ToolContext, ToolResult
from shared.tools.http_tool import USER_AGENT, error_excerpt
from shared.tools.netguard import SafeResponse, safe_request
from shared.tools.registry import tool

__all__ = [
    "HTTP_GET_MAX_BYTES",
    "HTTP_GET_TIMEOUT",
    "CalculatorArgs",
    "CurrentTimeArgs",
    "HttpGetArgs",
    "StopArgs",
    "calculator",
    "current_time",
    "evaluate",
    "format_number",
    "http_get",
    "stop",
]

Number = int | float

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 10_000
MAX_INT_BITS = 4096  # about 1233 decimal digits
MAX_ROUND_DIGITS = 100
MAX_DEPTH = 200
HTTP_GET_MAX_BYTES = 1_000_000
HTTP_GET_TIMEOUT = 20.0

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _round(x: Number, ndigits: int | None = None) -> Number:
    if ndigits is not None and (not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS):
        raise ToolError(f"round: ndigits must be an integer within ±{MAX_ROUND_DIGITS}")
    return round(x, ndigits)


_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "sqrt": math.sqrt,
    "log": math.log,
    "log10": math.log10,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
}


def evaluate(expression: str) -> Number:
    """Evaluate arithmetic without eval: numbers, + - * / // % ** (``^`` too), a few functions."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long (max {MAX_EXPRESSION_CHARS} characters)")
    try:
        tree = ast.parse(expression.replace("^", "**").strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise ToolError(f"cannot parse expression: {exc.args[0] if exc.args else exc}") from None
    except (RecursionError, MemoryError):
        raise ToolError("expression nested too deeply") from None
    try:
        return _checked(_eval(tree.body, 0))
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("result too large") from None
    except (ValueError, TypeError) as exc:
        raise ToolError(f"math error: {exc}") from None


def _eval(node: ast.expr, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise ToolError(f"expression nested too deeply (max depth {MAX_DEPTH})")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.Name):
        if node.id not in _CONSTANTS:
            raise ToolError(f"unknown name {node.id!r}; constants: {', '.join(_CONSTANTS)}")
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Call):
        return _call(node, depth)
    raise ToolError(f"unsupported expression: {_describe(node)}")


def _call(node: ast.Call, depth: int) -> Number:
    if not isinstance(node.func, ast.Name):
        raise ToolError(f"unsupported expression: {_describe(node.func)}")
    fn = _FUNCTIONS.get(node.func.id)
    if fn is None:
        raise ToolError(f"unknown function {node.func.id!r}; functions: {', '.join(_FUNCTIONS)}")
    if node.keywords or not node.args:
        raise ToolError(f"{node.func.id}() takes positional numeric arguments only")
    return _checked(fn(*(_eval(a, depth + 1) for a in node.args)))


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponent too large (max {MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exponent, int):
        _check_bits((abs(base).bit_length() - 1) * exponent)


def _check_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise ToolError("result too large")


def _checked(value: object) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result too large" if math.isinf(value) else "the result is not a number")
    if isinstance(value, int):
        _check_bits(value.bit_length())
    if not isinstance(value, int | float):
        raise ToolError("the result is not a real number")
    return value


def _describe(node: ast.AST) -> str:
    names = {ast.Attribute: "attribute access", ast.Subscript: "subscripts", ast.Lambda: "lambda"}
    return names.get(type(node), type(node).__name__)


def format_number(value: Number) -> str:
    return str(value) if isinstance(value, int) else f"{value:.15g}"


class CalculatorArgs(BaseModel):
    expression: str = Field(
        description="Arithmetic like `(2 + 3) * 4 ^ 2` or `sqrt(2) / pi`. Operators: + - * / "
        "// % ** ^; functions: " + ", ".join(_FUNCTIONS) + "; constants: pi, e, tau."
    )


@tool(read_only=True, quick=True)
def calculator(args: CalculatorArgs, ctx: ToolContext) -> ToolResult:
    """Evaluate an arithmetic expression exactly (integers) or to 15 significant digits."""
    value = evaluate(args.expression)
    return ToolResult(text=format_number(value), data={"value": value})


class CurrentTimeArgs(BaseModel):
    timezone: str | None = Field(
        default=None, description="IANA time zone such as `Europe/Paris`; default UTC."
    )


@tool(read_only=True, quick=True)
def current_time(args: CurrentTimeArgs, ctx: ToolContext) -> ToolResult:
    """The current date and time as ISO-8601, in UTC or the given IANA time zone."""
    now = datetime.now(_zone(args.timezone) if args.timezone else UTC)
    iso = now.isoformat(timespec="seconds")
    data = {"iso": iso, "timezone": args.timezone or "UTC", "weekday": now.strftime("%A")}
    return ToolResult(text=iso, data=data)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {name!r}; use an IANA name like Europe/Paris") from None


class StopArgs(BaseModel):
    reason: str | None = Field(default=None, description="Why the run stops (optional).")


@tool(read_only=True, internal=True)
def stop(args: StopArgs, ctx: ToolContext) -> ToolResult:
    """End the run now, without another model call. Use when the task is done or impossible."""
    return ToolResult(text="Stopped.", data={"reason": args.reason}, stop=True)


class HttpGetArgs(BaseModel):
    url: str = Field(description="The http(s) URL to fetch.")


@tool(read_only=True)
def http_get(args: HttpGetArgs, ctx: ToolContext) -> ToolResult:
    """Fetch a public web page or API with GET and return its text (size and time limited)."""
    response = safe_request(
        "GET",
        args.url,
        headers={"User-Agent": USER_AGENT, "Accept": "text/*, application/json;q=0.9, */*;q=0.5"},
        timeout=ctx.time_left(HTTP_GET_TIMEOUT),
        max_bytes=HTTP_GET_MAX_BYTES,
        allow_hosts=ctx.allow_hosts,
        pools=ctx.http,
        abort=ctx.abort,
    )
    if response.status_code >= 400:
        raise ToolError(f"HTTP {response.status_code}: {error_excerpt(response)}")
    data = {"status": response.status_code, "url": response.url, "type": response.content_type}
    return ToolResult(text=_page_text(response), data=data)


def _page_text(response: SafeResponse) -> str:
    kind = response.content_type
    textual = kind.startswith("text/") or any(
        k in kind for k in ("json", "xml", "javascript", "yaml", "csv")
    )
    if kind and not textual:
        return f"(binary content: {kind}, {len(response.content)} bytes; not shown)"
    return response.text or f"HTTP {response.status_code} (empty response)"
