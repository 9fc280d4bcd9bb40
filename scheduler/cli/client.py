"""A small synchronous client of the treadle HTTP API (docs/api.md), used by the CLI.

``ApiClient(url, key)`` sends ``Authorization: Bearer <key>`` when a key is given. Errors come
back as ``ApiError`` (HTTP status, ``code`` and ``message`` of the error body, or a connection
problem as status 0). ``events()`` follows the SSE stream of a run, reconnecting with
``Last-Event-ID`` after a dropped connection, until the terminal event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import SSEError, connect_sse

from shared.isotime import epoch
from shared.vocab import FINAL, TERMINAL_EVENTS, Status

TERMINAL = TERMINAL_EVENTS

__all__ = ["FINAL", "TERMINAL", "ApiClient", "ApiError", "Event"]

_RECONNECTS = 8


class ApiError(Exception):
    """An API error response, or the API not reachable (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True, slots=True)
class Event:
    """One SSE event: a durable one has its ``seq``; live deltas have none."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None
    ts: float | None = None  # when a durable event was written (epoch seconds, for durations)


def _error_of(resp: httpx.Response) -> ApiError:
    try:
        err = resp.json()["error"]
        return ApiError(resp.status_code, str(err["code"]), str(err["message"]))
    except (ValueError, KeyError, TypeError):
        return ApiError(resp.status_code, "http_error", resp.text[:500] or resp.reason_phrase)


def _event_of(event: str, data: str) -> Event:
    """Durable events carry ``{seq, run_id, type, data, ts}``; deltas ``{run_id, text, round}``
    (the SSE ``id:`` cannot tell them apart: a client keeps the last id for later events)."""
    body = json.loads(data) if data else {}
    if isinstance(body.get("seq"), int) and "type" in body:
        ts = epoch(body["ts"]) if isinstance(body.get("ts"), str) else None
        return Event(type=event, data=body.get("data") or {}, seq=body["seq"], ts=ts)
    return Event(type=event, data=body)


class ApiClient:
    """The API at ``url``; ``key`` is sent as a bearer token."""

    def __init__(
        self,
        url: str,
        key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout, read=max(timeout, 60.0)),
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- plumbing

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {self.url}: {exc}") from exc
        if resp.status_code >= 400:
            raise _error_of(resp)
        return resp.json() if resp.status_code != 204 else None

    # -- runs

    def submit(
        self,
        agent: dict[str, Any] | str,
        input: str | list[dict[str, Any]],
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"agent": agent, "input": input}
        if thread_id:
            body["thread_id"] = thread_id
        if metadata:
            body["metadata"] = metadata
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        out: dict[str, Any] = self.request("POST", "/v1/runs", json=body, headers=headers)
        return out

    def run(self, run_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", f"/v1/runs/{run_id}")
        return out

    def runs(
        self,
        *,
        status: str | None = None,
        thread_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        params = {
            k: v
            for k, v in {
                "status": status,
                "thread_id": thread_id,
                "limit": limit,
                "cursor": cursor,
            }.items()
            if v is not None
        }
        out: dict[str, Any] = self.request("GET", "/v1/runs", params=params)
        return out

    def search(
        self, params: list[tuple[str, str]], *, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/runs`` with filters (``metadata.<key>``, ``agent``, ``status``...)."""
        query = [*params, ("limit", str(limit))] + ([("cursor", cursor)] if cursor else [])
        out: dict[str, Any] = self.request("GET", "/v1/runs", params=query)
        return out

    def bulk(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/runs/{cancel|suspend|resume}`` by ids or filter."""
        out: dict[str, Any] = self.request("POST", f"/v1/runs/{action}", json=body)
        return out

    def messages(self, run_id: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/v1/runs/{run_id}/messages")["messages"])

    def tool_calls(self, run_id: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/v1/runs/{run_id}/tool-calls")["tool_calls"])

    def usage(self, run_id: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/v1/runs/{run_id}/usage")["usage"])

    def agents(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/v1/agents")["agents"])

    def answer(self, run_id: str, ask_id: str, answers: list[str]) -> dict[str, Any]:
        body = {"ask_id": ask_id, "answers": answers}
        out: dict[str, Any] = self.request("POST", f"/v1/runs/{run_id}/answer", json=body)
        return out

    def decide(
        self,
        run_id: str,
        approval_id: str,
        decisions: list[dict[str, Any]],
        note: str | None = None,
    ) -> dict[str, Any]:
        """Per-item decisions: approve, reject (with a message), edit (with arguments)."""
        body: dict[str, Any] = {"approval_id": approval_id, "decisions": decisions}
        if note:
            body["note"] = note
        out: dict[str, Any] = self.request("POST", f"/v1/runs/{run_id}/approval", json=body)
        return out

    def cancel(self, run_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("POST", f"/v1/runs/{run_id}/cancel")
        return out

    def resume(self, run_id: str, agent: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"agent": agent} if agent else None
        out: dict[str, Any] = self.request("POST", f"/v1/runs/{run_id}/resume", json=body)
        return out

    def wait(
        self,
        run_id: str,
        *,
        stop_at: frozenset[str] = FINAL | {Status.WAITING},
        timeout: float | None = None,
        interval: float = 0.3,
    ) -> dict[str, Any]:
        """Poll until the run's status is in ``stop_at`` (or ``timeout`` seconds pass)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.run(run_id)
            if run["status"] in stop_at or (deadline and time.monotonic() > deadline):
                return run
            time.sleep(interval)

    # -- live events

    def events(self, run_id: str, after: int = 0) -> Iterator[Event]:
        """Every durable event after ``after`` and live deltas, until the terminal event.
        A dropped connection is resumed from the last seen seq (``Last-Event-ID``)."""
        cursor, failures = after, 0
        while True:
            try:
                for ev in self._stream(run_id, cursor):
                    failures = 0
                    cursor = ev.seq if ev.seq is not None else cursor
                    yield ev
                    if ev.type in TERMINAL:
                        return
                return  # 204: the run is over and nothing is left to send
            except (httpx.TransportError, SSEError) as exc:
                failures += 1
                if failures > _RECONNECTS:
                    raise ApiError(0, "unreachable", f"event stream lost: {exc}") from exc
                time.sleep(min(0.25 * 2**failures, 3.0))

    def _stream(self, run_id: str, cursor: int) -> Iterator[Event]:
        headers = {"Last-Event-ID": str(cursor)} if cursor else {}
        with connect_sse(self.http, "GET", f"/v1/runs/{run_id}/events", headers=headers) as es:
            resp = es.response
            if resp.status_code == 204:
                return
            if resp.status_code >= 400:
                resp.read()
                raise _error_of(resp)
            for sse in es.iter_sse():
                if sse.event != "message" or sse.data:
                    yield _event_of(sse.event, sse.data)
            raise httpx.RemoteProtocolError("the event stream ended before the terminal event")
