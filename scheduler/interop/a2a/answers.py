"""What ``/a2a`` does to runs, in the request's thread (``scheduler.interop.a2a.server`` is
its async side): start a task's run through the command path of ``POST /v1/runs``, answer
its pause, cancel it, list an agent's tasks (docs/a2a.md)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict

from scheduler.http.agents import parse_ref, resolve, store_lookup
from scheduler.http.auth import Caller
from scheduler.interop.common import admit, facade_webhook
from shared.engine import commands
from shared.engine import threads as thread_engine
from shared.engine.runtime import Runtime
from shared.errors import Conflict, SpecError
from shared.interop.a2a_shapes import A2A
from shared.interop.thread_ids import CLIENT_THREAD_ID, scoped_id
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.db import reading
from shared.store.rows import RunRecord, Status

__all__ = [
    "agent_of",
    "answer",
    "cancel",
    "push_config",
    "record_of",
    "start",
    "tasks_of",
]

MAX_METADATA_BYTES = 16_384
_CONTEXT = re.compile(CLIENT_THREAD_ID)
YES = frozenset({"approve", "approved", "yes", "y", "ok"})
NO = frozenset({"reject", "rejected", "no", "n"})


def record_of(rt: Runtime, tenant: str, run_id: str) -> RunRecord | None:
    with reading(rt.engine) as conn:
        return run_store.get_run(conn, run_id, tenant)


def agent_of(record: RunRecord) -> str | None:
    """The named agent a run runs (``name`` of ``name@3``)."""
    return parse_ref(record.agent_ref)[0] if record.agent_ref else None


def _texts(message: pb.Message) -> list[str]:
    return [p.text for p in message.parts if p.HasField("text")]


def _data(message: pb.Message) -> dict[str, Any] | None:
    for part in message.parts:
        if part.HasField("data"):
            value = MessageToDict(part.data)
            return value if isinstance(value, dict) else None
    return None


def _thread(rt: Runtime, tenant: str, context_id: str) -> str | None:
    """The thread a context names (the client's name, scoped to the tenant, or an id the
    server made); None when there is none yet."""
    with reading(rt.engine) as conn:
        row = thread_store.get_thread(conn, scoped_id(tenant, context_id), tenant)
        row = row or thread_store.get_thread(conn, context_id, tenant)
    return str(row["id"]) if row is not None else None


def _thread_for(rt: Runtime, tenant: str, context_id: str) -> str:
    """The context's thread, made when new (a new conversation: a thread the server names)."""
    if not context_id:
        thread_id = str(uuid.uuid4())
        thread_engine.create_thread(rt, tenant, {}, "enqueue", thread_id)
        return thread_id
    if not _CONTEXT.match(context_id):
        raise SpecError("contextId: 1-40 characters, none of ~ / ? # % or whitespace")
    found = _thread(rt, tenant, context_id)
    if found is not None:
        return found
    thread_id = scoped_id(tenant, context_id)
    try:
        thread_engine.create_thread(rt, tenant, {}, "enqueue", thread_id)
    except Conflict:  # made by a concurrent message meanwhile
        pass
    return thread_id


def _metadata(meta: dict[str, Any], message: pb.Message) -> dict[str, Any] | None:
    both = {**meta, **(MessageToDict(message.metadata) if message.HasField("metadata") else {})}
    if len(json.dumps(both).encode()) > MAX_METADATA_BYTES:
        raise SpecError(f"metadata is at most {MAX_METADATA_BYTES} bytes as JSON")
    return both or None


def start(
    rt: Runtime,
    caller: Caller,
    agent: str,
    message: pb.Message,
    configuration: pb.SendMessageConfiguration,
    meta: dict[str, Any],
) -> str:
    """A new task: the agent's run of the message's text, on its context's thread."""
    text = "\n".join(_texts(message))
    if not text.strip():
        raise SpecError("the message has no text part")
    resolved = resolve(agent, store_lookup(rt, caller.tenant))
    admit(rt, caller, resolved.policed, resolved.spec, [{"role": "user", "content": text}])
    metadata = _metadata(meta, message)
    webhook = None
    if configuration.HasField("task_push_notification_config"):
        url = configuration.task_push_notification_config.url
        webhook = facade_webhook(A2A, rt.settings, caller.tenant, agent, url)
    record, _ = commands.submit_run(
        rt,
        commands.RunInput(
            agent=resolved.spec,
            agent_ref=resolved.ref,
            input=text,
            tenant=caller.tenant,
            thread_id=_thread_for(rt, caller.tenant, message.context_id),
            metadata=metadata,
            webhook=webhook,
        ),
    )
    return str(record["id"])


def _answers(pending: dict[str, Any], message: pb.Message) -> list[str]:
    n = len(pending.get("questions") or [])
    data = _data(message) or {}
    given = data.get("answers") if isinstance(data.get("answers"), list) else _texts(message)
    if not given:
        raise SpecError("answer the questions: one text part each")
    out = [str(a) for a in given][:n]
    return out + ["(no answer)"] * (n - len(out))


def _decision(message: pb.Message) -> tuple[list[str] | str, str | None]:
    data = _data(message)
    if data is not None and "approve" in data:
        approve = data["approve"]
        note = data.get("note") if isinstance(data.get("note"), str) else None
        if approve == "all" or (
            isinstance(approve, list) and all(isinstance(a, str) for a in approve)
        ):
            return approve, note
        raise SpecError('approve: a list of call ids, or "all"')
    words = " ".join(_texts(message)).strip().lower()
    if words in YES:
        return "all", None
    if words in NO:
        return [], None
    raise SpecError('answer "approve" or "reject", or a data part {"approve": [call ids]}')


def answer(rt: Runtime, caller: Caller, record: RunRecord, message: pb.Message) -> None:
    """The message answers the task's pause: its ask, or its approval."""
    run = record.run
    if run.status != Status.WAITING or not run.pending:
        raise SpecError(f"task {run.id} is {run.status.value}, not waiting for input")
    pending = dict(run.pending)
    if pending.get("kind") == "ask":
        answers = _answers(pending, message)
        commands.answer_run(rt, caller.tenant, run.id, str(pending["ask_id"]), answers)
        return
    approve, note = _decision(message)
    by = caller.key_id or caller.tenant
    pause = str(pending["approval_id"])
    commands.approve_run(rt, caller.tenant, run.id, pause, approve, None, note, by=by)


def cancel(rt: Runtime, tenant: str, run_id: str) -> None:
    commands.cancel_run(rt, tenant, run_id)


def tasks_of(rt: Runtime, tenant: str, agent: str, context_id: str, size: int) -> list[RunRecord]:
    """The agent's latest tasks of the tenant (in one context, when it names one)."""
    thread_id = _thread(rt, tenant, context_id) if context_id else None
    if context_id and thread_id is None:
        return []
    with reading(rt.engine) as conn:
        found = run_store.list_runs(conn, tenant, thread_id=thread_id, limit=500)
    return [r for r in found if agent_of(r) == agent][:size]


def push_config(record: RunRecord) -> pb.TaskPushNotificationConfig | None:
    cfg = record.run.webhook or {}
    if cfg.get("render") != A2A:
        return None
    return pb.TaskPushNotificationConfig(task_id=record.run.id, id="webhook", url=cfg["url"])
