"""One external tool call (DESIGN §3 fan-out): claim the row, execute with a timeout, commit
the result and the join in one transaction. Whoever brings ``open_calls`` to 0 appends the
tool messages in call order and decides what comes next."""

from __future__ import annotations

import logging
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.agent.arguments import ArgumentsError, parse_arguments
from shared.agent.attachments import attachment_refs
from shared.agent.compression import reduce_tool_result, tool_result_budget
from shared.agent.decisions import Continue, Fail, Finish
from shared.agent.spec import AgentSpec
from shared.engine import afters, cache, children, metrics, threads
from shared.engine.afters import decode_after
from shared.engine.attachments import run_files
from shared.engine.catalog import build_catalog
from shared.engine.knowledge import Knowledge
from shared.engine.leases import renewer_for
from shared.engine.runtime import Runtime
from shared.errors import ToolError
from shared.llm.profiles import resolve_profile
from shared.store import repo
from shared.store.tables import outbox, runs, tool_calls
from shared.tools import InvalidToolArguments, ToolContext, ToolResult

__all__ = ["execute_tool", "join_changes", "run_tool"]

log = logging.getLogger("treadle.tool")


def run_tool(rt: Runtime, run_id: str, call_id: str, version: int, outbox_id: int | None) -> str:
    claimed = _claim(rt, run_id, call_id, version, outbox_id)
    if claimed is None:
        return "stale"
    run, call = claimed
    spec = cache.spec_of(run)
    sub = children.sub_agent_of(spec, call["name"])
    if sub is not None and not _too_deep(rt, run):
        return children.start_child(rt, spec, sub, run, call, outbox_id)
    if sub is not None:
        result = ToolResult(
            text=f"Tool error: sub-agents nest at most {children.MAX_DEPTH} levels deep"
        )
        return _commit(rt, spec, run, call, version, outbox_id, result)
    with (
        _lease_keeper(rt, run_id, call_id, call["attempts"]),
        metrics.TOOL_SECONDS.labels(tool=call["name"]).time(),
    ):
        result = execute_tool(rt, spec, run, call)
    return _commit(rt, spec, run, call, version, outbox_id, result)


def _too_deep(rt: Runtime, run: RowMapping) -> bool:
    if run["parent_run_id"] is None:
        return False
    with rt.engine.connect() as conn:
        return children.too_deep(conn, run["id"])


class _Stale(Exception):
    """The run moved past the message's version: roll the tool claim back."""


def _claim(
    rt: Runtime, run_id: str, call_id: str, version: int, outbox_id: int | None
) -> tuple[RowMapping, RowMapping] | None:
    """Claim the call and write ``tool.started`` in one transaction; (run, call) or None."""
    ts = repo.now()
    try:
        with rt.engine.begin() as conn:
            call = repo.claim_tool(conn, run_id, call_id, rt.settings.lease_seconds, ts)
            if call is None:
                _drop_if_finished(conn, run_id, call_id, outbox_id)
                return None
            run = repo.bump_event_seq(conn, run_id, version)
            if run is None:
                raise _Stale
            data = {
                "call_id": call_id,
                "name": call["name"],
                "round": call["round"],
                "attempt": call["attempts"],
            }
            hooks = repo.insert_event(
                conn, run, "tool.started", data, ts, rt.settings.redrive_seconds
            )
    except _Stale:
        return None
    rt.publish(hooks)
    rt.wake(run_id, run["event_seq"])
    return run, call


def _drop_if_finished(conn: Connection, run_id: str, call_id: str, outbox_id: int | None) -> None:
    if outbox_id is None:
        return
    status = conn.execute(
        sa.select(tool_calls.c.status).where(
            tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id
        )
    ).scalar()
    if status in (None, "done", children.CHILD):
        conn.execute(sa.delete(outbox).where(outbox.c.id == outbox_id))


def _lease_keeper(rt: Runtime, run_id: str, call_id: str, attempt: int) -> Any:
    """Keep the tool call's lease while it runs (the process's one renewer)."""
    return renewer_for(rt.engine, rt.settings.lease_seconds).hold(
        ("tool", run_id, call_id, attempt)
    )


def execute_tool(rt: Runtime, spec: AgentSpec, run: RowMapping, call: RowMapping) -> ToolResult:
    """Run the tool; any failure becomes its result text (SPEC L-5)."""
    refs = attachment_refs(run["inputs"])
    catalog = build_catalog(spec, rt.profiles, attachments=refs)
    tool = catalog.tools.get(call["name"])
    if tool is None:
        return ToolResult(text=f"Tool not found: {call['name']}")
    ctx = ToolContext(
        run_id=run["id"],
        call_id=call["call_id"],
        tenant=run["tenant"],
        deadline=run["deadline_at"],
        allow_hosts=tuple(h.strip() for h in rt.settings.allow_hosts.split(",") if h.strip()),
        attachments=refs,
        files=run_files(rt, run) if refs else None,
        knowledge=Knowledge(rt, run["tenant"]),
    )
    try:  # strict JSON first: json5 is pure Python (~100 ms for 500 characters)
        args = parse_arguments(call["arguments"] or "{}")
    except ArgumentsError as exc:
        return ToolResult(text=f"Invalid arguments for {call['name']}: {exc}")
    return _with_timeout(lambda: tool.execute(args, ctx), rt.settings.tool_timeout)


def _with_timeout(fn: Any, timeout: float) -> ToolResult:
    """Run ``fn`` in a thread, abandon it after ``timeout``; failures become results (L-5)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except Exception as exc:  # tool failure is data (L-5)
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True, name="tool-exec")
    t.start()
    t.join(timeout)
    if t.is_alive():
        return ToolResult(text=f"Tool error: timed out after {timeout:g}s")
    if "error" in box:
        return ToolResult(text=_error_text(box["error"]))
    result: ToolResult = box["result"]
    return result


def _error_text(exc: Exception) -> str:
    if isinstance(exc, InvalidToolArguments):
        return str(exc)  # the validation message as is (L-5)
    if not isinstance(exc, ToolError):
        log.warning("tool raised %s", type(exc).__name__, exc_info=exc)
    return f"Tool error: {exc}" if str(exc) else f"Tool error: {type(exc).__name__}"


def _commit(
    rt: Runtime,
    spec: AgentSpec,
    run: RowMapping,
    call: RowMapping,
    version: int,
    outbox_id: int | None,
    result: ToolResult,
) -> str:
    ts = repo.now()
    profile = resolve_profile(spec.model, rt.profiles)
    budget = tool_result_budget(profile.context_window, spec.tool_result_max_tokens)
    try:
        items = _commit_txn(rt, spec, run, call, version, outbox_id, result, budget, ts)
    except _Lost:
        return "lost"
    rt.publish(items)
    rt.wake(run["id"])
    return "committed"


class _Lost(Exception):
    """The commit lost a race: roll the whole transaction back."""


def _commit_txn(
    rt: Runtime,
    spec: AgentSpec,
    run: RowMapping,
    call: RowMapping,
    version: int,
    outbox_id: int | None,
    result: ToolResult,
    budget: int,
    ts: float,
) -> list[Any]:
    with rt.engine.begin() as conn:
        if run["thread_id"] and _join_ends_run(run):
            threads.lock(conn, run["thread_id"], ts)  # lock order: the thread first
        if run["parent_run_id"] and _join_tells_parent(run):  # lock order: ancestors first
            children.lock_lineage(conn, run["id"], ts=ts, ending=_join_ends_run(run))
        done = conn.execute(
            sa.update(tool_calls)
            .where(
                tool_calls.c.run_id == run["id"],
                tool_calls.c.call_id == call["call_id"],
                tool_calls.c.status == "running",
                tool_calls.c.attempts == call["attempts"],
            )
            .values(
                status="done",
                result=result.text,
                result_for_model=reduce_tool_result(result.text, budget),
                cost=result.cost,
                data=result.data,
                finished_at=ts,
                lease_until=None,
            )
        ).rowcount
        if done != 1:
            raise _Lost
        changes = repo.Changes(bump_version=False)
        changes.values.update(open_calls=runs.c.open_calls - 1, cost=runs.c.cost + result.cost)
        changes.event(
            "tool.finished",
            call_id=call["call_id"],
            name=call["name"],
            preview=result.text[:300],
            cost=result.cost,
        )
        nxt = afters.next_pending(conn, run["id"], call["round"])
        if nxt is not None:
            changes.outbox.append(("tool", {"call_id": nxt}))
        applied = repo.apply(
            conn, run["id"], version, changes, redrive_after=rt.settings.redrive_seconds, ts=ts
        )
        if applied is None:
            raise _Lost
        items = list(applied.outbox_ids)
        if applied.row["open_calls"] == 0:
            joined = threads.apply_final(
                conn,
                run["id"],
                version,
                join_changes(conn, applied.row, call["round"], spec, ts),
                thread_id=run["thread_id"],
                redrive_after=rt.settings.redrive_seconds,
                ts=ts,
            )
            items += joined.outbox_ids if joined else []
        repo.delete_outbox(conn, outbox_id)
    return items


def _join_ends_run(run: RowMapping) -> bool:
    """Whether the batch's join ends the run (a stop tool, a failure): it locks the thread."""
    return isinstance(decode_after(run["after_join"]), (Finish, Fail))


def _join_tells_parent(run: RowMapping) -> bool:
    """Whether the batch's join ends or pauses the run (a child's parent must then follow)."""
    return not isinstance(decode_after(run["after_join"]), Continue)


def join_changes(
    conn: Connection, run: RowMapping, round_: int, spec: AgentSpec, ts: float
) -> repo.Changes:
    """All calls of the batch are finished: append their messages and settle."""
    return afters.join_changes(conn, run, round_, ts, spec.ask_timeout_s)
