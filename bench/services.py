"""The outside world of the path users run, each in its own process (``bench.common.Outside``
starts them):

    python -m bench.services model --port P --latency 0.2   # the fake model
    python -m bench.services tool --port P                  # the HTTP tool's endpoint

``model``: the fake OpenAI-compatible server (``shared.llm.fake_server``, strict as OpenAI is)
streaming SSE; every reply is one call of the inline HTTP tool ``http_echo`` with a ~500-char
argument after ``--latency`` seconds before the first byte; the call id is numbered by the
assistant turns so far (stateless: any number of runs at once; no request is kept).
``GET /stats`` says how many calls are open now and the most at once so far.

``model --script ask``: the first reply of a run is an ``ask_user`` call (``ASK``), the reply
after its answer is text; with ``--call-log PATH`` each request's arrival is appended to PATH
as ``<the run's first user message> <assistant turns so far> <epoch seconds>`` (the bench's
clock for "answer → next model request").

``tool``: ``POST /echo`` returns ``{"text": …}`` of its JSON body (a read-only tool).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shared.llm.fake_server import FakeState, ReplySpec, create_app

HTTP_TOOL = "http_echo"
HTTP_TOOL_FACE = {  # its name, description and parameters, as the model sees them
    "name": HTTP_TOOL,
    "description": "Echo the text back.",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}
TEXT_500 = ("The quick brown fox jumps over the lazy dog; " * 12)[:480]


def http_tool_responder(latency: float, text: str = TEXT_500) -> Any:
    def responder(body: dict[str, Any]) -> ReplySpec:
        n = sum(1 for m in body.get("messages") or () if m.get("role") == "assistant")
        call = {"id": f"call_{n}", "name": HTTP_TOOL, "arguments": {"text": text}}
        return ReplySpec(tool_calls=[call], first_byte_latency=latency)

    return responder


ASK = {
    "reason": "I need the user's choice to go on.",
    "questions": [
        {
            "question": "Which colour should the report use?",
            "options": [{"label": "Red", "value": "red"}, {"label": "Blue", "value": "blue"}],
        }
    ],
}
ANSWER = "Thanks: the report will be red."


def ask_responder(latency: float, call_log: str | None) -> Any:
    def responder(body: dict[str, Any]) -> ReplySpec:
        messages = body.get("messages") or []
        if call_log:
            first: dict[str, Any] = next((m for m in messages if m.get("role") == "user"), {})
            turns = sum(1 for m in messages if m.get("role") == "assistant")
            with open(call_log, "a", encoding="utf-8") as fh:
                fh.write(f"{first.get('content')} {turns} {time.time():.6f}\n")
        if any(m.get("role") == "tool" for m in messages):
            return ReplySpec(text=ANSWER, first_byte_latency=latency)
        call = {"id": "ask_1", "name": "ask_user", "arguments": ASK}
        return ReplySpec(tool_calls=[call], first_byte_latency=latency)

    return responder


def tool_app() -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"text": body.get("text", "")})

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/health", health)])


def _stats(state: FakeState) -> Any:
    """``GET /stats``: the model calls open now and the most open at once so far."""

    async def stats(_: Request) -> JSONResponse:
        return JSONResponse({"in_flight": state.in_flight, "peak": state.max_concurrency})

    return stats


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the bench's model and tool endpoint")
    parser.add_argument("what", choices=["model", "tool"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0, help="model: s before 1st byte")
    parser.add_argument("--text-chars", type=int, default=480, help="model: tool argument size")
    parser.add_argument("--script", choices=["tool", "ask"], default="tool", help="model")
    parser.add_argument("--call-log", default=None, help="model --script ask: arrivals")
    args = parser.parse_args(argv)
    logging.getLogger("uvicorn.error").setLevel(logging.ERROR)
    if args.what == "model":
        text = (TEXT_500 * 10)[: args.text_chars]
        responder = (
            ask_responder(args.latency, args.call_log)
            if args.script == "ask"
            else http_tool_responder(args.latency, text)
        )
        state = FakeState(responder, keep_requests=False)
        app = create_app(state)
        app.router.routes.append(Route("/stats", _stats(state)))
    else:
        app = tool_app()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="error",
        access_log=False,
        lifespan="off",
        backlog=4096,
        timeout_keep_alive=60,
    )


if __name__ == "__main__":
    main()
