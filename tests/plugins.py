"""Tools for tests, loaded in worker processes with ``TREADLE_PLUGINS=tests.plugins``."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, Field

from shared.engine.guard_plugins import guardrail
from shared.engine.handlers import handler
from shared.errors import ToolError
from shared.tools import ToolContext, ToolResult, tool


class SleepArgs(BaseModel):
    seconds: float = Field(default=1.0, ge=0, le=30)
    label: str = ""


@tool(read_only=True)
def sleepy(args: SleepArgs, ctx: ToolContext) -> ToolResult:
    """Sleep, then report when it started and ended (epoch seconds)."""
    start = time.time()
    time.sleep(args.seconds)
    return ToolResult(
        text=f"slept {args.seconds:g}s {args.label}".strip(),
        data={"start": start, "end": time.time(), "pid": os.getpid()},
    )


class EchoArgs(BaseModel):
    text: str


@tool(read_only=True)
def echo(args: EchoArgs, ctx: ToolContext) -> ToolResult:
    """Return the text."""
    return ToolResult(text=args.text)


class Nothing(BaseModel):
    pass


@tool(read_only=True)
def boom(args: Nothing, ctx: ToolContext) -> ToolResult:
    """Always fails."""
    raise ToolError("the flux capacitor is cold")


class BigArgs(BaseModel):
    size: int = Field(default=1_000_000, ge=1, le=5_000_000)


@tool(read_only=True)
def big(args: BigArgs, ctx: ToolContext) -> ToolResult:
    """Return a large result."""
    line = "lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    return ToolResult(text=(line * (args.size // len(line) + 1))[: args.size])


class PricedArgs(BaseModel):
    cost: float = 0.01


@tool(read_only=True)
def priced(args: PricedArgs, ctx: ToolContext) -> ToolResult:
    """A tool that reports a cost."""
    return ToolResult(text="paid", cost=args.cost)


class WriteArgs(BaseModel):
    item: str
    seconds: float = Field(default=0.0, ge=0, le=30)


@tool(read_only=False)
def write_thing(args: WriteArgs, ctx: ToolContext) -> ToolResult:
    """A write with an external effect, recorded once per idempotency key (like a real API)."""
    if args.seconds:
        time.sleep(args.seconds)
    path = os.environ.get("TREADLE_TEST_EFFECTS")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{ctx.idempotency_key} {args.item}\n")
    return ToolResult(text=f"wrote {args.item}")


def _fake_dns() -> None:
    """``TREADLE_TEST_DNS=host=addr,...``: this process resolves those names so (the DNS
    rebinding test gives a worker an answer other than the API's)."""
    import socket

    table = dict(
        item.split("=", 1) for item in os.environ.get("TREADLE_TEST_DNS", "").split(",") if item
    )
    if not table:
        return
    real = socket.getaddrinfo

    def getaddrinfo(host: object, port: object, *args: object, **kwargs: object) -> object:
        if host in table:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (table[host], int(port or 0)))]  # type: ignore[call-overload]
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]


_fake_dns()


# --- failures injected for the attempt bound (L-12) ------------------------------------------


class WorkerLost(BaseException):
    """In-process tests: the worker died here (nothing below catches a BaseException)."""


@tool(read_only=False)
def lost(args: Nothing, ctx: ToolContext) -> ToolResult:
    """Its worker dies while it runs (in-process tests only)."""
    raise WorkerLost(f"worker lost during {ctx.call_id}")


@handler("poisoned")
def _poisoned(text: str) -> str:
    """A router handler that fails the same way every time (a deterministic bug)."""
    raise RuntimeError(f"poisoned handler for {text[:40]!r}")


@guardrail("no_secrets")
def _no_secrets(text: str, stage: str) -> str | None:
    """Trips on the word "secret" (a plugin guardrail for tests)."""
    return f"the {stage} mentions a secret" if "secret" in text.lower() else None


@guardrail("slow_no_secrets")
def _slow_no_secrets(text: str, stage: str) -> str | None:
    """``no_secrets`` after half a second (a parallel guardrail that fires mid-call)."""
    time.sleep(0.5)
    return _no_secrets(text, stage)


class ProgressArgs(BaseModel):
    steps: int = Field(default=5, ge=1, le=50)
    delay: float = Field(default=0.5, ge=0, le=10)


@tool(read_only=True)
def progressive(args: ProgressArgs, ctx: ToolContext) -> ToolResult:
    """Wait ``delay`` seconds, then report progress ``steps`` times, then finish."""
    time.sleep(args.delay)
    for i in range(1, args.steps + 1):
        ctx.progress(i, args.steps, f"step {i} of {args.steps}")
        time.sleep(0.02)
    return ToolResult(text=f"did {args.steps} steps")
