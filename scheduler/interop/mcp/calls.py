"""One ``tools/call`` on ``/mcp``: a run of the named agent, followed until it ends, pauses
or the call's wait runs out (docs/mcp.md). The wiring is ``scheduler.interop.mcp.server``.

* The run is submitted through the command path of ``POST /v1/runs`` (the same checks).
* While it works, each durable event of the run is a progress notification.
* It ended: its answer is the result (``structuredContent``: the agent's output, for an agent
  with an ``output_schema``); a failed or cancelled run is an ``isError`` result.
* Still going after ``TREADLE_CALL_WAIT_S``: the result is its handle (run id, status and
  the resource ``treadle://runs/{id}`` to read or subscribe to); the run goes on.
* It paused on an ask or an approval: a client that declared elicitation is asked (a server
  request on a 2025 session, an ``InputRequiredResult`` on the 2026-07-28 protocol), its
  answer resumes the run and the call follows it on; any other client gets the pause with a
  resume token (``POST /v1/runs/{id}/answer`` or ``/approval`` with ``X-Resume-Token``).
* The call cancelled (``notifications/cancelled``, or the request dropped): the run is too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from scheduler.http import limits
from scheduler.http.agents import resolve, store_lookup
from scheduler.http.auth import Caller
from scheduler.http.errors import client_path
from scheduler.http.schemas import run_view
from scheduler.http.tail import Batch, follow
from scheduler.interop.common import progress_text, submit_facade_run
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.errors import Conflict, TreadleError
from shared.store import deliveries
from shared.store import runs as run_store
from shared.store.db import reading
from shared.store.rows import FINAL, RunRecord, Status
from shared.vocab import SEGMENT_ENDS

__all__ = [
    "HANDLE_SCHEMA",
    "RUN_URI",
    "CallArgs",
    "Followed",
    "cancel_quietly",
    "elicitation",
    "ended_result",
    "follow_run",
    "handle_result",
    "paused_result",
    "record_of",
    "resume",
    "start_run",
    "state_of",
]

RUN_URI = "treadle://runs/"
MAX_METADATA_BYTES = 16_384
HANDLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["run_id", "status", "resource"],
    "properties": {
        "run_id": {"type": "string"},
        "status": {"enum": ["scheduled", "queued", "running", "waiting"]},
        "resource": {"type": "string", "description": "Read (or subscribe to) it for the end"},
        "pause": {"type": "object", "description": "What the run waits for"},
        "resume": {"type": "object", "description": "How to answer without an API key"},
    },
}
"""A run still going or paused: what a call answers instead of the agent's output."""


class CallArgs(BaseModel):
    """A tool's arguments: the message for the agent, and maybe a thread and metadata."""

    model_config = ConfigDict(extra="forbid")
    input: str = Field(min_length=1, max_length=200_000)
    thread_id: str | None = Field(default=None, min_length=1, max_length=64)
    metadata: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(json.dumps(value).encode()) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is at most {MAX_METADATA_BYTES} bytes as JSON")
        return value


INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "minLength": 1, "description": "The message for the agent"},
        "thread_id": {"type": "string", "description": "Continue this treadle thread"},
        "metadata": {
            "type": "object",
            "description": "The run's metadata (e.g. user_id, for an agent with memory)",
        },
    },
    "required": ["input"],
    "additionalProperties": False,
}


def parse_args(arguments: dict[str, Any] | None) -> CallArgs | str:
    """The arguments, or the message of what is wrong with them."""
    try:
        return CallArgs.model_validate(arguments or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        missing = first["type"] == "missing"
        where = client_path(first["loc"], arguments or {}, missing=missing) or "arguments"
        return f"invalid arguments: {where}: {first['msg']}"


def _submit(rt: Runtime, caller: Caller, name: str, args: CallArgs) -> str:
    agent = resolve(name, store_lookup(rt, caller.tenant))
    limits.admit(rt, caller, agent.policed, agent.spec, args.input)
    record = submit_facade_run(rt, agent, args.input, caller.tenant, args.thread_id, args.metadata)
    return str(record["id"])


async def start_run(rt: Runtime, caller: Caller, name: str, args: CallArgs) -> str:
    return await run_in_threadpool(_submit, rt, caller, name, args)


def record_of(rt: Runtime, tenant: str, run_id: str) -> RunRecord | None:
    with reading(rt.engine) as conn:
        return run_store.get_run(conn, run_id, tenant)


@dataclass(frozen=True)
class Followed:
    """Where a followed run is: ended, paused, or still going when the wait ran out."""

    state: Literal["ended", "paused", "running"]
    record: RunRecord
    cursor: int  # the last event seen (a resumed run is followed on from it)


async def follow_run(
    rt: Runtime, session: Any, run_id: str, tenant: str, cursor: int, wait_s: float
) -> Followed:
    """Follow the run's events from ``cursor`` (each one a progress notification) until it
    ends or pauses, for at most ``wait_s``."""
    with anyio.move_on_after(wait_s):
        async for item in follow(rt, run_id, cursor, ends=SEGMENT_ENDS, live=False):
            if not isinstance(item, Batch):
                continue
            for ev in item.events:
                cursor = int(ev["seq"])
                await session.report_progress(float(cursor), None, progress_text(ev))
            if item.last:
                break
    record = await run_in_threadpool(record_of, rt, tenant, run_id)
    if record is None:  # deleted meanwhile
        raise TreadleError(f"run {run_id} is gone")
    status = record.run.status
    state: Literal["ended", "paused", "running"] = (
        "ended" if status in FINAL else "paused" if status == Status.WAITING else "running"
    )
    return Followed(state, record, cursor)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _link(run_id: str) -> types.ResourceLink:
    return types.ResourceLink(
        type="resource_link",
        name=run_id,
        uri=RUN_URI + run_id,
        mime_type="application/json",
        description="The run: read it for its status and result",
    )


def ended_result(record: RunRecord, schema: bool) -> types.CallToolResult:
    """A run that ended: its answer (the agent's output as structured content when it has an
    output schema), or an error result."""
    run = record.run
    if run.status == Status.COMPLETED:
        result = dict(run.result or {})
        text = str(result.get("text") or "")
        data = result.get("data")
        structured = {"run_id": run.id, "status": run.status.value, "text": text}
        if schema and isinstance(data, dict):
            structured = data  # the agent's output, as its schema says
        return types.CallToolResult(content=[_text(text)], structured_content=structured)
    error = (run.error or {}).get("message") or run.stop_reason or run.status.value
    return types.CallToolResult(
        content=[_text(f"run {run.id} {run.status.value}: {error}")],
        structured_content={"run_id": run.id, "status": run.status.value, "error": run.error},
        is_error=True,
    )


def _handle(run_id: str, status: str, **more: Any) -> dict[str, Any]:
    return {"run_id": run_id, "status": status, "resource": RUN_URI + run_id, **more}


def handle_result(record: RunRecord) -> types.CallToolResult:
    """A run still going: its id and resource; the call ends, the run does not."""
    run = record.run
    text = (
        f"run {run.id} is still {run.status.value}; read {RUN_URI}{run.id} (or subscribe to "
        "it) for its result"
    )
    return types.CallToolResult(
        content=[_text(text), _link(run.id)],
        structured_content=_handle(run.id, run.status.value),
    )


def _pause(pending: dict[str, Any]) -> tuple[str, str]:
    kind = str(pending.get("kind"))
    key = "ask_id" if kind == "ask" else "approval_id"
    return kind, str(pending.get(key))


def _issue(rt: Runtime, run_id: str, pending: dict[str, Any]) -> str:
    kind, pause_id = _pause(pending)
    with rt.engine.begin() as conn:
        return deliveries.issue_token(
            conn, run_id, kind, pause_id, pending.get("expires_at"), run_store.now()
        )


async def paused_result(rt: Runtime, record: RunRecord) -> types.CallToolResult:
    """A paused run for a client that cannot be asked: the pause, and a resume token that
    answers it without an API key."""
    run, pending = record.run, dict(record.run.pending or {})
    kind, pause_id = _pause(pending)
    token = await run_in_threadpool(_issue, rt, run.id, pending)
    path = f"/v1/runs/{run.id}/{'answer' if kind == 'ask' else 'approval'}"
    body: dict[str, Any] = {"approval_id": pause_id, "approve": ["<call_id>"]}
    if kind == "ask":
        body = {"ask_id": pause_id, "answers": ["..."]}
    resume = {"kind": kind, "pause_id": pause_id, "token": token, "path": path, "body": body}
    view = run_view(record).pending or {}
    text = (
        f"run {run.id} is waiting on {kind} {pause_id}. Answer it with POST {path} and the "
        f"header X-Resume-Token: {token} (body like {json.dumps(body)}); then read "
        f"{RUN_URI}{run.id}."
    )
    return types.CallToolResult(
        content=[_text(text), _link(run.id)],
        structured_content=_handle(run.id, "waiting", pause=view, resume=resume),
    )


def can_elicit(session: Any) -> bool:
    caps = session.client_capabilities
    return bool(caps is not None and caps.elicitation is not None)


def modern(protocol_version: str) -> bool:
    return protocol_version in MODERN_PROTOCOL_VERSIONS


def elicitation(record: RunRecord) -> types.ElicitRequestFormParams:
    """The form that asks the person what the run waits for."""
    pending = dict(record.run.pending or {})
    props: dict[str, Any] = {}
    if pending.get("kind") == "ask":
        for i, q in enumerate(pending.get("questions") or [], start=1):
            prop: dict[str, Any] = {"type": "string", "title": str(q.get("question"))[:500]}
            options = q.get("options") or []
            if options:
                prop["oneOf"] = [{"const": o["value"], "title": o["label"]} for o in options]
            props[f"answer_{i}"] = prop
        message = str(pending.get("reason") or "The agent has a question.")
    else:
        for i, item in enumerate(pending.get("items") or [], start=1):
            props[f"approve_{i}"] = {
                "type": "boolean",
                "title": f"Approve {item.get('tool')}",
                "description": str(item.get("preview") or "")[:1000],
                "default": False,
            }
        props["note"] = {"type": "string", "title": "A note for the agent (optional)"}
        message = "The agent proposes writes that need your approval."
    required = [k for k in props if k != "note"]
    schema = {"type": "object", "properties": props, "required": required}
    return types.ElicitRequestFormParams(message=message, requested_schema=schema)


def _answer(rt: Runtime, caller: Caller, record: RunRecord, result: types.ElicitResult) -> bool:
    """Resume the run with what the person answered; False when there is nothing to apply
    (an ask declined, anything cancelled): the run stays paused."""
    run, pending = record.run, dict(record.run.pending or {})
    kind, pause_id = _pause(pending)
    content = result.content or {}
    if result.action == "cancel" or (result.action == "decline" and kind == "ask"):
        return False
    try:
        if kind == "ask":
            n = len(pending.get("questions") or [])
            answers = [str(content.get(f"answer_{i}", "")) for i in range(1, n + 1)]
            commands.answer_run(rt, caller.tenant, run.id, pause_id, answers)
        else:
            items = pending.get("items") or []
            accepted = result.action == "accept"
            chosen = [
                str(it["call_id"])
                for i, it in enumerate(items, start=1)
                if accepted and content.get(f"approve_{i}") is True
            ]
            raw = content.get("note")
            note = raw if isinstance(raw, str) else None
            by = caller.key_id or caller.tenant
            commands.approve_run(rt, caller.tenant, run.id, pause_id, chosen, None, note, by=by)
    except Conflict:
        return True  # answered meanwhile (elsewhere): follow the run on
    return True


async def resume(rt: Runtime, caller: Caller, record: RunRecord, result: Any) -> bool:
    return await run_in_threadpool(_answer, rt, caller, record, result)


def state_of(record: RunRecord, cursor: int) -> str:
    """The opaque ``request_state`` of an ``InputRequiredResult``: which run and pause."""
    _, pause_id = _pause(dict(record.run.pending or {}))
    return json.dumps({"run": record.run.id, "pause": pause_id, "seq": cursor})


def parse_state(state: str) -> tuple[str, str, int] | None:
    """A client's echoed ``request_state`` (it may have been tampered with: every use checks
    the run against the caller's tenant and its current pause)."""
    try:
        doc = json.loads(state)
        return str(doc["run"])[:64], str(doc["pause"])[:200], max(0, int(doc["seq"]))
    except (ValueError, KeyError, TypeError):
        return None


async def cancel_quietly(rt: Runtime, tenant: str, run_id: str) -> None:
    """The call was cancelled: so is its run (unless it already ended)."""
    with anyio.CancelScope(shield=True):
        try:
            await run_in_threadpool(commands.cancel_run, rt, tenant, run_id)
        except TreadleError:
            pass
