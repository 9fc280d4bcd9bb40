"""Inline HTTP tools declared in an agent spec (docs/api.md).

``{arg}`` placeholders in the URL are filled from the arguments (URL-quoted); the other
arguments become the JSON body (POST, PUT, PATCH) or query parameters (GET, DELETE). Header
values come only from environment variables named in ``headers_env``, read at call time.
A tool is read-only only if declared so (N-5); every call of a write tool, and every call
with a write method, sends ``Idempotency-Key: <run_id>:<call_id>``. A successful response
with the header ``Treadle-Stop: true`` ends the run after this call (SPEC L-6), as a plugin
tool's ``ToolResult(stop=True)`` does. A ``text/event-stream`` answer reports its
``progress`` frames as they arrive (``shared.tools.http_progress``).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from shared.agent.spec import HttpToolSpec, InlineTool
from shared.errors import SpecError, ToolError
from shared.tools.base import InvalidToolArguments, ToolContext, ToolResult
from shared.tools.http_progress import is_event_stream, progress_watch, sse_result
from shared.tools.inline import InlineFace
from shared.tools.netguard import SafeResponse, safe_request

__all__ = [
    "HTTP_TOOL_MAX_BYTES",
    "STOP_HEADER",
    "USER_AGENT",
    "HttpTool",
    "error_excerpt",
    "fill_url",
    "wants_stop",
]

HTTP_TOOL_MAX_BYTES = 1_000_000
USER_AGENT = "treadle-tool/0.1"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_EXCERPT_CHARS = 300
STOP_HEADER = "Treadle-Stop"
_TRUE = frozenset({"true", "1", "yes"})


class HttpTool(InlineFace):
    """A ``Tool`` that calls one HTTP endpoint through the SSRF guard (its name, description,
    parameters and trust as the spec declares them: ``InlineFace``)."""

    def __init__(
        self,
        spec: InlineTool,
        *,
        max_bytes: int = HTTP_TOOL_MAX_BYTES,
        client: httpx.Client | None = None,
    ) -> None:
        if spec.http is None:
            raise SpecError(f"inline tool {spec.name!r} has no `http` section")
        _check_template(spec.name, spec.http.url)
        self._spec = spec
        self._http: HttpToolSpec = spec.http
        self._max_bytes = max_bytes
        self._client = client

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self._require(args)
        url, rest = fill_url(self._http.url, args)
        has_body = self._http.method in _BODY_METHODS
        response = safe_request(
            self._http.method,
            url,
            headers=self._headers(ctx),
            params=None if has_body else _query(rest),
            json=rest if has_body else None,
            timeout=ctx.time_left(self._http.timeout_s),
            max_bytes=self._max_bytes,
            allow_hosts=ctx.allow_hosts,
            client=self._client,
            pools=ctx.http,
            abort=ctx.abort,
            watch=progress_watch(ctx),
        )
        if response.status_code >= 400:
            raise ToolError(f"HTTP {response.status_code}: {error_excerpt(response)}")
        text = sse_result(response.text) if is_event_stream(response.headers) else response.text
        text = text or f"HTTP {response.status_code} (empty response)"
        return ToolResult(
            text=text, data={"status": response.status_code}, stop=wants_stop(response)
        )

    def _require(self, args: dict[str, Any]) -> None:
        if not isinstance(args, dict):
            raise InvalidToolArguments(f"Invalid arguments for {self.name}: expected an object")
        required = self.parameters.get("required") or []
        missing = [str(k) for k in required if k not in args]
        if missing:
            raise InvalidToolArguments(
                f"Invalid arguments for {self.name}: missing required {', '.join(missing)}"
            )

    def _headers(self, ctx: ToolContext) -> dict[str, str]:
        headers = {"Accept": "application/json, text/plain;q=0.9, */*;q=0.5"}
        headers["User-Agent"] = USER_AGENT
        for header, var in self._http.headers_env.items():
            value = ctx.environ.get(var)
            if value is None:
                raise ToolError(f"environment variable {var} (header {header}) is not set")
            headers[header] = value
        if not self.read_only or self._http.method != "GET":
            headers["Idempotency-Key"] = ctx.idempotency_key
        return headers


def fill_url(template: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The URL with ``{arg}`` placeholders filled (quoted), and the arguments not used."""
    used = set(_PLACEHOLDER.findall(template))
    missing = sorted(used - args.keys())
    if missing:
        raise InvalidToolArguments(f"missing URL argument(s): {', '.join(missing)}")
    url = _PLACEHOLDER.sub(lambda m: quote(_as_text(args[m.group(1)]), safe=""), template)
    return url, {k: v for k, v in args.items() if k not in used}


def wants_stop(response: SafeResponse) -> bool:
    """Whether the endpoint asked to end the run: ``Treadle-Stop: true`` (or ``1``, ``yes``)."""
    return response.headers.get(STOP_HEADER, "").strip().lower() in _TRUE


def error_excerpt(response: SafeResponse) -> str:
    """A short one-line excerpt of an error body."""
    text = " ".join(response.text.split())
    if len(text) > _EXCERPT_CHARS:
        text = text[:_EXCERPT_CHARS] + "..."
    return text or "(empty body)"


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _query(args: dict[str, Any]) -> dict[str, Any]:
    """Query parameters: scalars and lists as they are, objects as JSON, None left out."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        if value is None:
            continue
        if isinstance(value, list):
            out[key] = [v if _scalar(v) else json.dumps(v) for v in value]
        else:
            out[key] = value if _scalar(value) else json.dumps(value)
    return out


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)


def _check_template(name: str, template: str) -> None:
    probe = _PLACEHOLDER.sub("x", template)
    parts = urlsplit(probe)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecError(f"inline tool {name!r}: url must be an absolute http(s) URL")
